//! Where driver bundles come from, besides a directory that configuration
//! management puts in the store: the reference operator's precompiled
//! driver images, and tarballs (a file or an `http(s)` URL, with their
//! sha256).
//!
//! It owns turning either into a bundle at `<store>/<version>-<kernel>/`:
//! - [`import_image`] takes the copy of a driver image that an init
//!   container left in a staging directory (`opt/lib/modules/<kernel>/`,
//!   `firmwareDir/updates/amdgpu/`) and keeps the `modules.*` index files,
//!   amdgpu with the modules it needs per `modules.dep` (not the image's
//!   whole kernel tree) and amdgpu's firmware, with caps on each file's size,
//!   the count and the total;
//! - [`fetch_tarball`] and [`ensure_fetched`] check a tarball's sha256
//!   before anything in it is unpacked, and unpack only regular files and
//!   directories, with caps on size and count.
//!
//! Both write within one [`DiskBudget`]: a bound on what the work holds in
//! the store and a margin of free space left on its filesystem, checked
//! before writing and as bytes are written.
//!
//! Every new bundle is built in a directory of the store whose name starts
//! with `.` (which [`bundle::find`] skips), written a manifest for
//! ([`bundle::write_manifest`]) or checked against its own, verified
//! ([`bundle::verify`]), and only then renamed into place: nobody sees a
//! half-made bundle, the same bundle again is a no-op, and a different one
//! already at that name is replaced only when asked.
//!
//! It must not load anything nor decide which bundle the agent uses (that
//! is [`super::manager`]'s), and it reaches the network only for a URL its
//! caller names. Host paths go through [`HostRoot`].

use std::io::{self, BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bundle::{
    self, Expected, MANIFEST, MAX_FILE_BYTES, MAX_FILES, MAX_MODULES_DEP_BYTES, Manifest, Refusal,
    Verified, is_plain_name, is_sha256_hex, path_problem,
};
use super::space::DiskBudget;
use crate::host::{HostError, HostRoot};

/// Where a driver image keeps its modules: `<this>/<kernel>/`.
pub const IMAGE_MODULES: &str = "opt/lib/modules";
/// Where a driver image keeps amdgpu's firmware.
pub const IMAGE_FIRMWARE: &str = "firmwareDir/updates/amdgpu";
/// The file at a bundle's top that says where it came from. Not under
/// `lib/modules/` or `firmware/`, which the manifest lists exactly.
pub const SOURCE_MARKER: &str = "source.json";

/// Work directories in the store: skipped by [`bundle::find`] for their `.`.
const IMPORT_PREFIX: &str = ".import-";
const FETCH_PREFIX: &str = ".fetch-";
/// A GNU long name or a pax header is a path and a few times; more is hostile.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;
/// How deep a firmware tree may go (a link to a parent would loop).
const MAX_TREE_DEPTH: usize = 16;
/// Where a bundle keeps amdgpu's firmware.
const FIRMWARE_DIR: &str = "firmware/amdgpu";

/// A bundle from a source, and what happened in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placed {
    pub placement: Placement,
    /// The bundle's directory, a host path: `<store>/<version>-<kernel>`.
    pub dir: String,
    pub version: String,
    pub kernel_release: String,
    /// What verifying it found; `None` when a tarball with that sha256 was
    /// fetched before and nothing was read again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verified>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Placement {
    /// A new bundle is in the store.
    Added,
    /// The same bundle was there already; nothing changed.
    AlreadyPresent,
    /// Another bundle at that name was replaced, as asked.
    Replaced,
}

/// Why a source did not become a bundle.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The source was read and refused: its sha256, an unsafe tarball
    /// entry, or a bundle that does not verify.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Another bundle is already at the name, and replacing was not asked.
    #[error("{dir} already holds another bundle ({why}); ask to replace it (--replace)")]
    Occupied { dir: String, why: String },
    /// The source cannot be used as named: a bad tag, URL or sha256, a
    /// staging directory that is not a driver image's copy.
    #[error("{0}")]
    Invalid(String),
    /// The source cannot be read: a missing file, a failed download.
    #[error("{0}")]
    Unavailable(String),
    /// The store cannot be written.
    #[error("{0}")]
    Store(String),
    /// The fetch or import would hold more on disk than it may, or leave
    /// less free than it must ([`super::space`]).
    #[error("not enough room in the bundle store: {0}")]
    NoSpace(String),
}

impl SourceError {
    /// The reason, as conditions and Events would name it.
    pub fn reason(&self) -> &'static str {
        match self {
            SourceError::Refused(refusal) => refusal.reason(),
            SourceError::Occupied { .. } => "BundleExists",
            SourceError::Invalid(_) => "BundleSourceInvalid",
            SourceError::Unavailable(_) => "BundleSourceUnavailable",
            SourceError::Store(_) => "BundleStoreUnwritable",
            SourceError::NoSpace(_) => "BundleStoreFull",
        }
    }

    /// The source was looked at and turned down (exit status 1), rather
    /// than not usable or not reachable at all (2).
    pub fn is_refusal(&self) -> bool {
        matches!(self, SourceError::Refused(_) | SourceError::Occupied { .. })
    }
}

fn store_error(e: impl std::fmt::Display) -> SourceError {
    SourceError::Store(e.to_string())
}

/// A write into the work directory failed: out of room by the fetch's or
/// import's disk budget, or the store cannot be written.
fn write_error(path: &Path, e: io::Error) -> SourceError {
    if e.kind() == io::ErrorKind::StorageFull {
        SourceError::NoSpace(e.to_string())
    } else {
        store_error(format!("{}: {e}", path.display()))
    }
}

/// `<dir>/<relative>` for host paths.
fn join(dir: &str, relative: &str) -> String {
    format!("{}/{relative}", dir.trim_end_matches('/'))
}

/// What the marker at a bundle's top says about where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceMarker {
    pub kind: SourceKind,
    /// The image tag or staging directory, or the tarball's path or URL
    /// (without credentials or query).
    pub source: String,
    /// The tarball's sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceKind {
    DriverImage,
    Tarball,
}

// ---------------------------------------------------------------------------
// Names: tags, bundle directories, sha256 text. Pure.

/// What a driver image's tag says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageTag {
    pub os: String,
    pub os_version: String,
    pub kernel_release: String,
    pub version: String,
}

/// Parses a driver image's tag, `<os>-<osver>-<kernel>-<version>` (e.g.
/// `ubuntu-22.04-6.8.0-49-generic-6.12.12`), or a whole image reference
/// that ends in one (`registry/amdgpu-driver:<tag>`). The version is the
/// last `-` component, the kernel what sits between `<os>-<osver>-` and
/// `-<version>`. Pure.
pub fn parse_image_tag(text: &str) -> Result<ImageTag, String> {
    let bad = |why: &str| {
        format!(
            "image tag {text:?}: {why}; expected <os>-<osver>-<kernel>-<version>, e.g. ubuntu-22.04-6.8.0-49-generic-6.12.12"
        )
    };
    if text.contains('@') {
        return Err(bad("a digest names no kernel, give the tag"));
    }
    // `host:port/name:tag`: the tag is after the last `:`, past the last `/`.
    let tag = match text.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => tag,
        _ if text.contains('/') => return Err(bad("an image reference without a tag")),
        _ => text,
    };
    let tag_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if tag.is_empty()
        || tag.len() > 128
        || !tag.chars().all(tag_chars)
        || tag.starts_with(['.', '-'])
    {
        return Err(bad(
            "not a tag (letters, digits, `_`, `.`, `-`, at most 128)",
        ));
    }
    let parts: Vec<&str> = tag.split('-').collect();
    if parts.len() < 4 || parts.iter().any(|p| p.is_empty()) {
        return Err(bad("too few `-`-separated parts, or an empty one"));
    }
    let (os, os_version, version) = (parts[0], parts[1], parts[parts.len() - 1]);
    let kernel_release = parts[2..parts.len() - 1].join("-");
    let starts_with_digit = |s: &str| s.starts_with(|c: char| c.is_ascii_digit());
    if !os.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(bad(&format!("the OS {os:?} does not start with a letter")));
    }
    if !starts_with_digit(os_version) {
        return Err(bad(&format!(
            "the OS version {os_version:?} is not a number"
        )));
    }
    if !starts_with_digit(&kernel_release) {
        return Err(bad(&format!(
            "the kernel {kernel_release:?} does not start with a digit"
        )));
    }
    if !starts_with_digit(version) {
        return Err(bad(&format!(
            "the driver version {version:?} does not start with a digit"
        )));
    }
    Ok(ImageTag {
        os: os.to_owned(),
        os_version: os_version.to_owned(),
        kernel_release,
        version: version.to_owned(),
    })
}

/// The directory name of a bundle in the store, `<version>-<kernel>`, when
/// both make a safe name: one path component, not hidden (work in
/// progress is), printable. Pure.
pub fn bundle_name(version: &str, kernel_release: &str) -> Result<String, String> {
    let printable = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '~'))
    };
    if version.is_empty() || version.starts_with('.') || !printable(version) {
        return Err(format!(
            "driver version {version:?} cannot name a directory (letters, digits, `.`, `_`, `-`, `+`, `~`; not starting with `.`)"
        ));
    }
    if !is_plain_name(kernel_release) || !printable(kernel_release) {
        return Err(format!(
            "kernel release {kernel_release:?} cannot name a directory"
        ));
    }
    Ok(format!("{version}-{kernel_release}"))
}

/// A sha256 as 64 hex digits (either case), in lowercase. Pure.
pub fn parse_sha256(text: &str) -> Result<String, String> {
    let lower = text.trim().to_ascii_lowercase();
    if is_sha256_hex(&lower) {
        Ok(lower)
    } else {
        Err(format!("sha256 {text:?} is not 64 hexadecimal digits"))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Driver images.

/// amdgpu and every module it needs, transitively, per `modules.dep`: paths
/// relative to `lib/modules/<kernel_release>/`, amdgpu first. Each must be
/// a plain relative path inside that directory. Pure.
pub fn amdgpu_closure(modules_dep: &str, kernel_release: &str) -> Result<Vec<String>, String> {
    let Some((amdgpu, _)) = bundle::amdgpu_in_modules_dep(modules_dep, kernel_release) else {
        return Err("modules.dep names no amdgpu module".into());
    };
    let prefix = format!("/lib/modules/{kernel_release}/");
    let relative = |p: &str| p.strip_prefix(&prefix).unwrap_or(p).to_owned();
    let mut needs = std::collections::BTreeMap::new();
    for line in modules_dep.lines() {
        if let Some((module, deps)) = line.split_once(':') {
            let deps: Vec<String> = deps.split_whitespace().map(relative).collect();
            needs.insert(relative(module.trim()), deps);
        }
    }
    let mut closure = vec![amdgpu];
    let mut next = 0;
    while next < closure.len() {
        let module = closure[next].clone();
        next += 1;
        if let Some(why) = path_problem(
            &format!("lib/modules/{kernel_release}/{module}"),
            kernel_release,
        ) {
            return Err(format!("modules.dep names {module:?}: {why}"));
        }
        for dep in needs.get(&module).into_iter().flatten() {
            if !closure.contains(dep) {
                closure.push(dep.clone());
            }
        }
    }
    Ok(closure)
}

/// A driver image's copy to turn into a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageImport {
    /// The directory the image was copied into (a host path): it holds
    /// `opt/lib/modules/<kernel>/` and `firmwareDir/updates/amdgpu/`.
    pub staging: String,
    pub kernel_release: String,
    pub version: String,
    /// The image's tag, when known: recorded in the bundle's marker.
    pub tag: Option<String>,
    /// Modules must be signed for the bundle to be kept.
    pub signature_required: bool,
    /// Replace a different bundle already at the bundle's name.
    pub replace: bool,
    /// The most the bundle's copied files may take in the store, added up.
    pub max_total_bytes: u64,
    /// Free space the import must leave on the store's filesystem.
    pub min_free_bytes: u64,
}

/// Turns the staging copy of a driver image into the bundle
/// `<store>/<version>-<kernel>` (see the module doc). Every file to copy is
/// found and sized first, and the total checked against the budget before
/// anything is written; the copies are charged to it as they are written,
/// so a file that grows meanwhile or a disk that fills stops the import too.
/// Blocking: it copies and hashes tens of MiB, so async callers run it on
/// `spawn_blocking`.
pub fn import_image(
    host: &HostRoot,
    store: &str,
    import: &ImageImport,
) -> Result<Placed, SourceError> {
    let kernel = &import.kernel_release;
    bundle_name(&import.version, kernel).map_err(SourceError::Invalid)?;
    let staging = import.staging.as_str();
    let (modules, firmware) = image_directories(host, staging, kernel)?;
    let closure = image_closure(host, staging, &modules, kernel)?;

    let mut files = module_files(
        host,
        staging,
        &modules,
        &closure,
        &format!("lib/modules/{kernel}"),
    )?;
    firmware_files(host, staging, &firmware, FIRMWARE_DIR, 0, &mut files)?;

    host.create_dir_all(store).map_err(store_error)?;
    let budget = DiskBudget::new(
        host.path(store),
        import.max_total_bytes,
        import.min_free_bytes,
    );
    let total = files
        .iter()
        .fold(0u64, |sum, file| sum.saturating_add(file.size));
    budget
        .check_room(total)
        .map_err(|e| write_error(&host.path(store), e))?;
    // From here, any error drops `work`, which removes what was copied.
    let work = WorkDir::new(host, store, IMPORT_PREFIX)?;
    for file in &files {
        copy_file(host, &file.from, &work.path.join(&file.to), &budget)?;
    }

    let manifest = bundle::write_manifest(host, &work.host_path, &import.version, kernel)?;
    let expected = Expected {
        kernel_release: kernel.clone(),
        version: Some(import.version.clone()),
        signature_required: import.signature_required,
    };
    let verified = bundle::verify(host, &work.host_path, &expected)?;
    let marker = SourceMarker {
        kind: SourceKind::DriverImage,
        source: import.tag.clone().unwrap_or_else(|| staging.to_owned()),
        sha256: None,
    };
    write_marker(host, &work.host_path, &marker)?;
    let placed = place(
        host,
        store,
        &work.host_path,
        &manifest,
        verified,
        &expected,
        import.replace,
    )?;
    tracing::info!(
        dir = %placed.dir,
        placement = ?placed.placement,
        version = %placed.version,
        kernel = %placed.kernel_release,
        source = %marker.source,
        "driver image imported"
    );
    Ok(placed)
}

/// The image's modules directory for `kernel` and its firmware directory
/// in `staging`, or why the copy is not one of a driver image for it.
fn image_directories(
    host: &HostRoot,
    staging: &str,
    kernel: &str,
) -> Result<(String, String), SourceError> {
    if !host.path(staging).is_dir() {
        return Err(SourceError::Unavailable(format!(
            "{staging}: no such directory"
        )));
    }
    let modules = join(staging, &format!("{IMAGE_MODULES}/{kernel}"));
    if !host.exists(&modules) {
        let present = host
            .list_dir_or_empty(join(staging, IMAGE_MODULES))
            .unwrap_or_default();
        return Err(SourceError::Invalid(format!(
            "{staging} has no {IMAGE_MODULES}/{kernel}/: the image is not for kernel {kernel}, or the copy missed it (it holds: {})",
            if present.is_empty() {
                "nothing".to_owned()
            } else {
                present.join(", ")
            }
        )));
    }
    let firmware = join(staging, IMAGE_FIRMWARE);
    if !host.exists(&firmware) {
        return Err(SourceError::Invalid(format!(
            "{staging} has no {IMAGE_FIRMWARE}/: copy the image's /firmwareDir too"
        )));
    }
    within_staging(host, staging, &modules)?;
    Ok((modules, firmware))
}

/// amdgpu and what it needs, from the image's `modules.dep`.
fn image_closure(
    host: &HostRoot,
    staging: &str,
    modules: &str,
    kernel: &str,
) -> Result<Vec<String>, SourceError> {
    let missing = |why: String| Refusal::ModuleMissing {
        dir: modules.to_owned(),
        why,
    };
    let modules_dep = join(modules, "modules.dep");
    within_staging(host, staging, &modules_dep)?;
    let mut text = Vec::new();
    host.read_chunks(&modules_dep, MAX_MODULES_DEP_BYTES, |c| {
        text.extend_from_slice(c)
    })
    .map_err(|e| missing(e.to_string()))?;
    Ok(amdgpu_closure(&String::from_utf8_lossy(&text), kernel).map_err(missing)?)
}

/// One file an import copies: from a host path of the staging copy to a
/// path relative to the bundle, and its size when it was looked at.
struct ImportFile {
    from: String,
    to: String,
    size: u64,
}

impl ImportFile {
    /// `from` (already checked to resolve within the staging copy), sized.
    fn new(host: &HostRoot, from: String, to: String) -> Result<Self, SourceError> {
        let size = std::fs::metadata(host.path(&from))
            .map_err(|e| SourceError::Unavailable(format!("{}: {e}", host.path(&from).display())))?
            .len();
        Ok(Self { from, to, size })
    }
}

/// The `modules.*` index files and the modules of `closure` (amdgpu first)
/// in the image's `modules` directory, to go under `to` in the bundle.
fn module_files(
    host: &HostRoot,
    staging: &str,
    modules: &str,
    closure: &[String],
    to: &str,
) -> Result<Vec<ImportFile>, SourceError> {
    let mut files = Vec::new();
    for name in host.list_dir(modules).map_err(unavailable)? {
        if name.starts_with("modules.") {
            let from = join(modules, &name);
            within_staging(host, staging, &from)?;
            if host.path(&from).is_file() {
                files.push(ImportFile::new(host, from, join(to, &name))?);
            }
        }
    }
    let amdgpu = closure.first().cloned().unwrap_or_default();
    for module in closure {
        let from = join(modules, module);
        if !host.exists(&from) {
            return Err(SourceError::Refused(if *module == amdgpu {
                Refusal::ModuleMissing {
                    dir: modules.to_owned(),
                    why: format!("modules.dep names {module}, which the image does not hold"),
                }
            } else {
                Refusal::DependencyMissing {
                    module: join(modules, &amdgpu),
                    dependency: module.clone(),
                }
            }));
        }
        within_staging(host, staging, &from)?;
        files.push(ImportFile::new(host, from, join(to, module))?);
    }
    Ok(files)
}

fn unavailable(e: HostError) -> SourceError {
    SourceError::Unavailable(e.to_string())
}

/// `path` of the staging tree resolves (through any symbolic link) inside
/// `staging`: an image's link to its own `/lib/modules` would name a file
/// of whoever runs the import.
fn within_staging(host: &HostRoot, staging: &str, path: &str) -> Result<(), SourceError> {
    match host.resolves_within(staging, path) {
        Ok(true) => Ok(()),
        Ok(false) => Err(SourceError::Refused(Refusal::PathEscapesBundle {
            path: path.to_owned(),
            why: format!("a symbolic link points out of {staging}"),
        })),
        Err(e) => Err(unavailable(e)),
    }
}

/// Copies the host file `from` (capped) to `to`, a new file in a work
/// directory, creating its parents, each chunk charged to `budget` before
/// it is written.
fn copy_file(
    host: &HostRoot,
    from: &str,
    to: &Path,
    budget: &DiskBudget,
) -> Result<(), SourceError> {
    let mut input = host
        .open_capped(from, MAX_FILE_BYTES)
        .map_err(unavailable)?;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| store_error(format!("{}: {e}", parent.display())))?;
    }
    let mut output =
        std::fs::File::create_new(to).map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(SourceError::Unavailable(format!(
                    "{}: {e}",
                    input.path().display()
                )));
            }
        };
        budget.charge(n as u64).map_err(|e| write_error(to, e))?;
        output
            .write_all(&buf[..n])
            .map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    }
}

/// The files under the host directory `from`, to go under `to` in the
/// bundle, added to `files`: symbolic links that stay in `staging` are
/// followed (firmware trees link one file name to another), those that
/// leave it refused.
fn firmware_files(
    host: &HostRoot,
    staging: &str,
    from: &str,
    to: &str,
    depth: usize,
    files: &mut Vec<ImportFile>,
) -> Result<(), SourceError> {
    within_staging(host, staging, from)?;
    if depth > MAX_TREE_DEPTH {
        return Err(SourceError::Invalid(format!(
            "{from}: more than {MAX_TREE_DEPTH} directories deep (a link loop?)"
        )));
    }
    for name in host.list_dir(from).map_err(unavailable)? {
        let path = join(from, &name);
        within_staging(host, staging, &path)?;
        let meta = std::fs::metadata(host.path(&path)).map_err(|e| {
            SourceError::Unavailable(format!("{}: {e}", host.path(&path).display()))
        })?;
        if meta.is_dir() {
            firmware_files(host, staging, &path, &join(to, &name), depth + 1, files)?;
        } else if meta.is_file() {
            // The module files are in `files` too; the cap is on the bundle.
            if files.len() >= MAX_FILES {
                return Err(SourceError::Invalid(format!(
                    "{from}: more than {MAX_FILES} files"
                )));
            }
            files.push(ImportFile {
                from: path,
                to: join(to, &name),
                size: meta.len(),
            });
        } else {
            return Err(SourceError::Invalid(format!(
                "{path}: neither a file nor a directory"
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The store: work directories, markers, placing a bundle.

/// A directory in the store to build a bundle in, removed with everything
/// left in it when dropped: a refused or interrupted import or fetch leaves
/// nothing behind.
struct WorkDir {
    dir: tempfile::TempDir,
    /// Where it is on this machine (under the host root).
    path: PathBuf,
    /// Its host path.
    host_path: String,
}

impl WorkDir {
    fn new(host: &HostRoot, store: &str, prefix: &str) -> Result<Self, SourceError> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(host.path(store))
            .map_err(|e| store_error(format!("{store}: cannot make a work directory: {e}")))?;
        let name = dir
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| store_error(format!("{store}: the work directory has no name")))?
            .to_owned();
        Ok(Self {
            path: dir.path().to_path_buf(),
            host_path: join(store, &name),
            dir,
        })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // TempDir removes it; a failure is only worth a line in the log.
        if self.dir.path().exists()
            && let Err(e) = std::fs::remove_dir_all(self.dir.path())
        {
            tracing::warn!(dir = %self.host_path, error = %e, "work directory not removed");
        }
    }
}

fn write_marker(host: &HostRoot, dir: &str, marker: &SourceMarker) -> Result<(), SourceError> {
    let json = serde_json::to_vec_pretty(marker).map_err(store_error)?;
    host.write(join(dir, SOURCE_MARKER), json)
        .map_err(store_error)
}

/// The marker of the bundle in `dir`, if it has a readable one.
pub fn read_marker(host: &HostRoot, dir: &str) -> Option<SourceMarker> {
    let text = host.read_string(join(dir, SOURCE_MARKER)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The bundle in `store` fetched from a tarball of this sha256, if any:
/// its directory and manifest. What the agent asks before downloading.
pub fn already_fetched(host: &HostRoot, store: &str, sha256: &str) -> Option<(String, Manifest)> {
    let names = host.list_dir(store).ok()?;
    names
        .into_iter()
        .filter(|name| !name.starts_with('.'))
        .find_map(|name| {
            let dir = join(store, &name);
            let marker = read_marker(host, &dir)?;
            if marker.kind != SourceKind::Tarball || marker.sha256.as_deref() != Some(sha256) {
                return None;
            }
            let manifest = bundle::read_manifest(host, &dir).ok()?;
            Some((dir, manifest))
        })
}

/// What is at a bundle's name already, against the new bundle.
enum AtTarget {
    Nothing,
    Same(Verified),
    Different(String),
}

fn at_target(host: &HostRoot, target: &str, new: &Manifest, expected: &Expected) -> AtTarget {
    if std::fs::symlink_metadata(host.path(target)).is_err() {
        return AtTarget::Nothing;
    }
    let existing = match bundle::read_manifest(host, target) {
        Ok(existing) => existing,
        Err(refusal) => return AtTarget::Different(format!("its manifest: {refusal}")),
    };
    if existing != *new {
        let differ =
            if existing.version != new.version || existing.kernel_release != new.kernel_release {
                format!(
                    "driver {} for kernel {}",
                    existing.version, existing.kernel_release
                )
            } else {
                "the same driver and kernel, other files".to_owned()
            };
        return AtTarget::Different(differ);
    }
    match bundle::verify(host, target, expected) {
        Ok(verified) => AtTarget::Same(verified),
        Err(refusal) => AtTarget::Different(format!(
            "the same manifest, but it does not verify: {}: {refusal}",
            refusal.reason()
        )),
    }
}

/// Moves the verified bundle at `built` (a host path in the store) to
/// `<store>/<version>-<kernel>`, unless the same bundle is there already;
/// a different one is swapped out only when `replace` (the old one is
/// then in `built`, removed with the work directory).
fn place(
    host: &HostRoot,
    store: &str,
    built: &str,
    manifest: &Manifest,
    verified: Verified,
    expected: &Expected,
    replace: bool,
) -> Result<Placed, SourceError> {
    let name = bundle_name(&manifest.version, &manifest.kernel_release).map_err(|why| {
        Refusal::ManifestInvalid {
            dir: built.to_owned(),
            why,
        }
    })?;
    let target = join(store, &name);
    let placed = |placement, verified: Verified| Placed {
        placement,
        dir: target.clone(),
        version: manifest.version.clone(),
        kernel_release: manifest.kernel_release.clone(),
        verified: Some(Verified {
            dir: target.clone(),
            ..verified
        }),
    };
    set_directory_mode(host, built)?;
    // Twice: another import of the same bundle may rename its own into
    // place between the look and the rename.
    for _ in 0..2 {
        match at_target(host, &target, manifest, expected) {
            AtTarget::Same(existing) => return Ok(placed(Placement::AlreadyPresent, existing)),
            AtTarget::Different(why) if !replace => {
                return Err(SourceError::Occupied {
                    dir: target.clone(),
                    why,
                });
            }
            AtTarget::Different(why) => {
                host.exchange(built, &target).map_err(store_error)?;
                tracing::info!(dir = %target, replaced = %why, "bundle replaced");
                return Ok(placed(Placement::Replaced, verified));
            }
            AtTarget::Nothing => {}
        }
        match host.rename(built, &target) {
            Ok(()) => return Ok(placed(Placement::Added, verified)),
            Err(HostError::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(store_error(format!(
        "{target}: keeps changing while the bundle is moved there"
    )))
}

/// Work directories are made private (0700); a bundle is readable by all,
/// as one that configuration management puts in the store would be.
fn set_directory_mode(host: &HostRoot, dir: &str) -> Result<(), SourceError> {
    use std::os::unix::fs::PermissionsExt;
    let path = host.path(dir);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| store_error(format!("{}: {e}", path.display())))
}

// ---------------------------------------------------------------------------
// Tarballs.

/// A tarball holding one bundle, and its sha256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TarballSource {
    /// An absolute host path, or an `http://` or `https://` URL.
    pub source: String,
    /// 64 hex digits.
    pub sha256: String,
}

/// How much a fetch may download, unpack and wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// The tarball as downloaded (compressed).
    pub max_tarball_bytes: u64,
    /// The files it unpacks to, added up.
    pub max_unpacked_bytes: u64,
    /// What the work directory may hold at once: the tarball, its
    /// decompressed copy and the unpacked files together. The compressed
    /// tarball goes once it is decompressed, the decompressed copy once it is
    /// unpacked.
    pub max_total_bytes: u64,
    /// Free space the fetch must leave on the store's filesystem, checked
    /// before each stage and while writing.
    pub min_free_bytes: u64,
    /// Its entries, directories included.
    pub max_entries: usize,
    pub connect_timeout: Duration,
    /// For the whole download, redirects included.
    pub timeout: Duration,
    pub max_redirects: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            // A bundle is amdgpu's modules for one kernel and its firmware:
            // well under 1 GiB.
            max_tarball_bytes: 2 << 30,
            max_unpacked_bytes: 2 << 30,
            max_total_bytes: 4 << 30,
            min_free_bytes: 1 << 30,
            // The files a bundle may list, and as many directories.
            max_entries: 2 * MAX_FILES,
            connect_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(30 * 60),
            max_redirects: 5,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchOptions {
    pub limits: FetchLimits,
    /// Modules must be signed for the bundle to be kept.
    pub signature_required: bool,
    /// Replace a different bundle already at the bundle's name.
    pub replace: bool,
}

/// One source's outcome in [`ensure_fetched`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The source as it may be shown (no credentials or query).
    pub source: String,
    pub result: Result<Placed, SourceError>,
}

/// Where a tarball is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Url(hyper::Uri),
    /// A host path.
    Path(String),
}

/// An `http(s)://` URL or an absolute path. Pure.
pub fn parse_location(text: &str) -> Result<Location, String> {
    let scheme = text.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("http" | "https") => {
            let uri: hyper::Uri = text
                .parse()
                .map_err(|e| format!("{}: not a URL: {e}", redact(text)))?;
            if uri.host().is_none_or(str::is_empty) {
                return Err(format!("{}: no host", redact(text)));
            }
            Ok(Location::Url(uri))
        }
        Some(other) => Err(format!(
            "{}: {other}:// is not supported, only http://, https:// or a file",
            redact(text)
        )),
        None if text.starts_with('/') => Ok(Location::Path(text.to_owned())),
        None => Err(format!(
            "{text:?}: a tarball is an absolute path or an http(s) URL"
        )),
    }
}

/// A source as it may be logged, printed and recorded: a URL without user
/// name, password or query (signed URLs carry their token there). Pure.
pub fn redact(source: &str) -> String {
    let Some((scheme, rest)) = source.split_once("://") else {
        return source.to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{authority}{path}")
}

/// The URL a redirect's `Location` names, from the URL that answered. Pure.
pub fn resolve_redirect(from: &hyper::Uri, location: &str) -> Result<hyper::Uri, String> {
    let scheme = from.scheme_str().unwrap_or("http");
    let authority = from.authority().map(|a| a.as_str()).unwrap_or_default();
    let absolute = if location.contains("://") {
        location.to_owned()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let dir = from.path().rsplit_once('/').map_or("", |(dir, _)| dir);
        format!("{scheme}://{authority}{dir}/{location}")
    };
    match parse_location(&absolute)? {
        Location::Url(uri) => Ok(uri),
        Location::Path(_) => Err(format!("redirect to {location:?}")),
    }
}

/// Fetches each tarball not fetched before (no bundle in the store carries
/// its sha256 in its marker), one after the other. What the agent calls
/// for the sources a DeviceConfig names; every outcome is logged too.
pub async fn ensure_fetched(
    host: &HostRoot,
    store: &str,
    sources: &[TarballSource],
    options: &FetchOptions,
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(sources.len());
    for source in sources {
        let result = fetch_tarball(host, store, source, options).await;
        let shown = redact(&source.source);
        if let Err(e) = &result {
            tracing::warn!(
                source = %shown,
                reason = e.reason(),
                error = %e,
                "driver bundle tarball not fetched"
            );
        }
        outcomes.push(Outcome {
            source: shown,
            result,
        });
    }
    outcomes
}

/// Fetches one tarball into the store: downloaded (or copied) into a work
/// directory while hashed, its sha256 checked, unpacked safely, verified
/// against its own manifest for the kernel that manifest names, marked
/// with where it came from, and renamed to `<store>/<version>-<kernel>`.
/// A tarball of the same sha256 fetched before is not read again, unless
/// `options.replace` asks for it (a bundle damaged since is fetched anew).
pub async fn fetch_tarball(
    host: &HostRoot,
    store: &str,
    source: &TarballSource,
    options: &FetchOptions,
) -> Result<Placed, SourceError> {
    let sha256 = parse_sha256(&source.sha256).map_err(SourceError::Invalid)?;
    let location = parse_location(&source.source).map_err(SourceError::Invalid)?;
    let shown = redact(&source.source);

    let (h, s, sha) = (host.clone(), store.to_owned(), sha256.clone());
    let before = if options.replace {
        None
    } else {
        blocking(move || Ok(already_fetched(&h, &s, &sha))).await?
    };
    if let Some((dir, manifest)) = before {
        tracing::debug!(source = %shown, dir = %dir, "tarball fetched before");
        return Ok(Placed {
            placement: Placement::AlreadyPresent,
            dir,
            version: manifest.version,
            kernel_release: manifest.kernel_release,
            verified: None,
        });
    }

    let (h, s) = (host.clone(), store.to_owned());
    let work = blocking(move || {
        h.create_dir_all(&s).map_err(store_error)?;
        WorkDir::new(&h, &s, FETCH_PREFIX)
    })
    .await?;
    let tarball = work.path.join("tarball");
    let budget = Arc::new(DiskBudget::new(
        &work.path,
        options.limits.max_total_bytes,
        options.limits.min_free_bytes,
    ));
    let (actual, size) = match &location {
        Location::Url(uri) => download(uri, &tarball, &options.limits, &budget).await?,
        Location::Path(path) => {
            let (h, path, to, max, b) = (
                host.clone(),
                path.clone(),
                tarball.clone(),
                options.limits.max_tarball_bytes,
                budget.clone(),
            );
            blocking(move || copy_hashing(&h, &path, &to, max, &b)).await?
        }
    };
    if actual != sha256 {
        // Removing a tarball of GiBs blocks: not on the async threads.
        let _ = blocking(move || {
            drop(work);
            Ok(())
        })
        .await;
        return Err(SourceError::Refused(Refusal::ChecksumMismatch {
            path: shown,
            expected: sha256,
            actual,
        }));
    }
    tracing::debug!(source = %shown, bytes = size, "tarball checksum matches");

    let (h, s, options) = (host.clone(), store.to_owned(), options.clone());
    blocking(move || unpack_and_place(&h, &s, work, &shown, &sha256, &options, &budget)).await
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| store_error(format!("the work did not finish: {e}")))?
}

/// Copies the host file `from` to `to` while hashing it; more than `max`
/// bytes is refused before it is read.
fn copy_hashing(
    host: &HostRoot,
    from: &str,
    to: &Path,
    max: u64,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    // Named as the host path and where it was looked for: under a host
    // root other than / they differ, and the first alone names a file that
    // may well exist.
    let looked_at = host.path(from);
    let named = if looked_at.as_path() == Path::new(from) {
        from.to_owned()
    } else {
        format!(
            "{from} (the host path, looked for at {})",
            looked_at.display()
        )
    };
    let meta = std::fs::metadata(&looked_at)
        .map_err(|e| SourceError::Unavailable(format!("{named}: {e}")))?;
    if !meta.is_file() {
        return Err(SourceError::Unavailable(format!("{named}: not a file")));
    }
    if meta.len() > max {
        return Err(too_big(from, max));
    }
    budget
        .check_room(meta.len())
        .map_err(|e| write_error(to, e))?;
    let mut input = host.open_capped(from, max).map_err(unavailable)?;
    let mut output =
        std::fs::File::create_new(to).map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Grown past the cap since it was looked at, or unreadable.
            Err(e) => return Err(SourceError::Unavailable(format!("{from}: {e}"))),
        };
        context.update(&buf[..n]);
        budget.charge(n as u64).map_err(|e| write_error(to, e))?;
        output
            .write_all(&buf[..n])
            .map_err(|e| store_error(format!("{}: {e}", to.display())))?;
        size += n as u64;
    }
    Ok((hex(context.finish().as_ref()), size))
}

fn too_big(source: &str, max: u64) -> SourceError {
    SourceError::Refused(Refusal::UnsafeTarball {
        tarball: redact(source),
        why: format!("larger than the {max} bytes allowed"),
    })
}

/// The tarball's sha256 checked: unpack it in the work directory, find
/// the bundle in it, verify it and put it in place.
fn unpack_and_place(
    host: &HostRoot,
    store: &str,
    work: WorkDir,
    shown: &str,
    sha256: &str,
    options: &FetchOptions,
    budget: &DiskBudget,
) -> Result<Placed, SourceError> {
    let unpacked = work.path.join("unpacked");
    std::fs::create_dir(&unpacked)
        .map_err(|e| store_error(format!("{}: {e}", unpacked.display())))?;
    unpack(
        &work.path.join("tarball"),
        &work.path.join("tarball.tar"),
        &unpacked,
        shown,
        &options.limits,
        budget,
    )?;
    let root = bundle_root(&unpacked).map_err(|why| Refusal::ManifestInvalid {
        dir: shown.to_owned(),
        why,
    })?;
    let root_host = match root {
        Some(name) => join(&work.host_path, &format!("unpacked/{name}")),
        None => join(&work.host_path, "unpacked"),
    };
    let manifest = bundle::read_manifest(host, &root_host)?;
    let expected = Expected {
        kernel_release: manifest.kernel_release.clone(),
        version: None,
        signature_required: options.signature_required,
    };
    let verified = bundle::verify(host, &root_host, &expected)?;
    let marker = SourceMarker {
        kind: SourceKind::Tarball,
        source: shown.to_owned(),
        sha256: Some(sha256.to_owned()),
    };
    write_marker(host, &root_host, &marker)?;
    let placed = place(
        host,
        store,
        &root_host,
        &manifest,
        verified,
        &expected,
        options.replace,
    )?;
    if placed.placement == Placement::AlreadyPresent {
        // The same bundle from another source (an image, another
        // compression): remember this sha256 too, so it is not fetched again.
        write_marker(host, &placed.dir, &marker)?;
    }
    drop(work);
    tracing::info!(
        dir = %placed.dir,
        placement = ?placed.placement,
        version = %placed.version,
        kernel = %placed.kernel_release,
        source = %shown,
        "driver bundle tarball fetched"
    );
    Ok(placed)
}

/// Where the manifest is in an unpacked tarball: at its top (`None`), or in
/// its single top-level directory (`Some(name)`).
fn bundle_root(unpacked: &Path) -> Result<Option<String>, String> {
    if unpacked.join(MANIFEST).is_file() {
        return Ok(None);
    }
    let names: Vec<String> = std::fs::read_dir(unpacked)
        .map_err(|e| e.to_string())?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    match names.as_slice() {
        [only] if unpacked.join(only).join(MANIFEST).is_file() => Ok(Some(only.clone())),
        _ => Err(format!(
            "no {MANIFEST} at the tarball's top or in its single top-level directory"
        )),
    }
}

// ---------------------------------------------------------------------------
// Unpacking.

/// How a tarball is compressed, from its first bytes (not its name: a URL
/// need not end in one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Xz,
    Zstd,
}

impl Compression {
    /// Pure.
    pub fn sniff(start: &[u8]) -> Compression {
        if start.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if start.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
            Compression::Xz
        } else if start.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// What a tar entry is to the unpacker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
}

/// Regular files and directories are unpacked; anything else is refused
/// with what it is. Extension headers are handled before this. Pure.
pub fn entry_kind(kind: tar::EntryType) -> Result<EntryKind, String> {
    use tar::EntryType as T;
    match kind {
        T::Regular | T::Continuous => Ok(EntryKind::File),
        T::Directory => Ok(EntryKind::Directory),
        T::Symlink => Err("a symbolic link".into()),
        T::Link => Err("a hard link".into()),
        T::Char | T::Block => Err("a device file".into()),
        T::Fifo => Err("a FIFO".into()),
        T::GNUSparse => Err("a sparse file".into()),
        other => Err(format!("an entry of type {:?}", other.as_byte() as char)),
    }
}

/// An entry's path as components to put under the unpack directory:
/// relative, no `..`, UTF-8; empty and `.` components dropped (`./lib/`
/// is `lib`). Pure.
pub fn entry_path(raw: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "its name is not UTF-8".to_owned())?;
    if text.starts_with('/') {
        return Err("an absolute path".into());
    }
    if text.contains('\0') {
        return Err("a NUL in its name".into());
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("a `..` component".into()),
            part => parts.push(part.to_owned()),
        }
    }
    Ok(parts)
}

/// A writer that fails past `max` bytes: a decompressed stream may be
/// much bigger than what was downloaded.
struct CappedWriter<'a, W> {
    inner: W,
    written: u64,
    max: u64,
    budget: &'a DiskBudget,
}

impl<W: Write> Write for CappedWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len() as u64;
        if self.written > self.max {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("decompresses to more than {} bytes", self.max),
            ));
        }
        self.budget.charge(buf.len() as u64)?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Unpacks `tarball` into `into` (an empty directory of ours). A compressed
/// tarball is first decompressed to `scratch`, capped, so that the tar
/// reader sees a plain file. `shown` names the tarball in refusals.
/// Each work file goes as soon as the next stage has read it, so that the
/// work holds at most two stages at once; `budget` is charged as they are
/// written and credited as they go.
fn unpack(
    tarball: &Path,
    scratch: &Path,
    into: &Path,
    shown: &str,
    limits: &FetchLimits,
    budget: &DiskBudget,
) -> Result<(), SourceError> {
    let open = |path: &Path| {
        std::fs::File::open(path).map_err(|e| store_error(format!("{}: {e}", path.display())))
    };
    let mut start = [0u8; 6];
    let read = read_up_to(&mut open(tarball)?, &mut start)
        .map_err(|e| store_error(format!("{}: {e}", tarball.display())))?;
    let compression = Compression::sniff(&start[..read]);
    let plain = if compression == Compression::None {
        tarball.to_path_buf()
    } else {
        // Headers and padding: at most two 512-byte blocks per entry, and
        // each file rounded up to a block.
        let overhead = (limits.max_entries as u64 + 2) * 1536;
        decompress(
            compression,
            open(tarball)?,
            scratch,
            limits.max_unpacked_bytes.saturating_add(overhead),
            shown,
            budget,
        )?;
        remove_work_file(tarball, budget)?;
        scratch.to_path_buf()
    };
    // The tar's own size bounds what its files add up to.
    let tar_size = std::fs::metadata(&plain)
        .map_err(|e| store_error(format!("{}: {e}", plain.display())))?
        .len();
    budget
        .check_room(tar_size.min(limits.max_unpacked_bytes))
        .map_err(|e| write_error(into, e))?;
    unpack_tar(
        io::BufReader::new(open(&plain)?),
        into,
        shown,
        limits,
        budget,
    )?;
    remove_work_file(&plain, budget)
}

/// Removes a work file the next stage has read, and credits the budget.
fn remove_work_file(path: &Path, budget: &DiskBudget) -> Result<(), SourceError> {
    let size = std::fs::metadata(path)
        .map_err(|e| store_error(format!("{}: {e}", path.display())))?
        .len();
    std::fs::remove_file(path).map_err(|e| store_error(format!("{}: {e}", path.display())))?;
    budget.release(size);
    Ok(())
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn decompress(
    compression: Compression,
    input: std::fs::File,
    to: &Path,
    max: u64,
    shown: &str,
    budget: &DiskBudget,
) -> Result<(), SourceError> {
    let file =
        std::fs::File::create_new(to).map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    let mut out = CappedWriter {
        inner: io::BufWriter::new(file),
        written: 0,
        max,
        budget,
    };
    let mut input = io::BufReader::new(input);
    let done: Result<(), io::Error> = match compression {
        Compression::None => Ok(()),
        // Multi-member, as pigz and concatenated gzip files are.
        Compression::Gzip => {
            io::copy(&mut flate2::bufread::MultiGzDecoder::new(input), &mut out).map(drop)
        }
        Compression::Xz => lzma_rs::xz_decompress(&mut input, &mut out).map_err(|e| match e {
            lzma_rs::error::Error::IoError(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }),
        Compression::Zstd => zstd_frames(&mut input, &mut out),
    };
    let done = done.and_then(|()| out.flush());
    match done {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::StorageFull => {
            Err(SourceError::NoSpace(e.to_string()))
        }
        Err(e) if e.kind() == io::ErrorKind::FileTooLarge => {
            Err(SourceError::Refused(Refusal::UnsafeTarball {
                tarball: shown.to_owned(),
                why: e.to_string(),
            }))
        }
        Err(e) => Err(SourceError::Refused(Refusal::Unreadable(format!(
            "{shown}: not a readable {compression:?} stream: {e}"
        )))),
    }
}

/// Decompresses zstd frame after frame, as pzstd writes them.
fn zstd_frames(input: &mut impl BufRead, out: &mut impl Write) -> io::Result<()> {
    loop {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut *input)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        io::copy(&mut decoder, out)?;
        if input.fill_buf()?.is_empty() {
            return Ok(());
        }
    }
}

/// Reads an extension header's data (a long name, pax records), capped.
fn read_extension(entry: &mut impl Read, shown: &str) -> Result<Vec<u8>, SourceError> {
    let mut data = Vec::new();
    entry
        .take(MAX_EXTENSION_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| tar_unreadable(shown, e))?;
    if data.len() as u64 > MAX_EXTENSION_BYTES {
        return Err(unsafe_tarball(
            shown,
            format!("an extension header of more than {MAX_EXTENSION_BYTES} bytes"),
        ));
    }
    Ok(data)
}

fn unsafe_tarball(shown: &str, why: String) -> SourceError {
    SourceError::Refused(Refusal::UnsafeTarball {
        tarball: shown.to_owned(),
        why,
    })
}

fn tar_unreadable(shown: &str, e: io::Error) -> SourceError {
    SourceError::Refused(Refusal::Unreadable(format!(
        "{shown}: not a readable tar archive: {e}"
    )))
}

/// Unpacks a plain tar stream into `into`: regular files and directories
/// only, each path relative and without `..`, no file twice, within the
/// caps. The tar reader runs raw, so that long names and pax records are
/// read here, capped, rather than whole into memory.
fn unpack_tar(
    input: impl Read,
    into: &Path,
    shown: &str,
    limits: &FetchLimits,
    budget: &DiskBudget,
) -> Result<(), SourceError> {
    let mut archive = tar::Archive::new(input);
    let entries = archive
        .entries()
        .map_err(|e| tar_unreadable(shown, e))?
        .raw(true);
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax_size: Option<u64> = None;
    let (mut count, mut total) = (0usize, 0u64);
    for entry in entries {
        let mut entry = entry.map_err(|e| tar_unreadable(shown, e))?;
        count += 1;
        if count > limits.max_entries {
            return Err(unsafe_tarball(
                shown,
                format!("more than {} entries", limits.max_entries),
            ));
        }
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::GNULongName => {
                let mut name = read_extension(&mut entry, shown)?;
                while name.last() == Some(&0) {
                    name.pop();
                }
                long_name = Some(name);
                continue;
            }
            tar::EntryType::XHeader => {
                let data = read_extension(&mut entry, shown)?;
                for record in tar::PaxExtensions::new(&data) {
                    let record = record.map_err(|e| tar_unreadable(shown, e))?;
                    match record.key_bytes() {
                        b"path" => long_name = Some(record.value_bytes().to_vec()),
                        b"size" => {
                            let size = record.value().ok().and_then(|v| v.parse().ok());
                            pax_size = Some(size.ok_or_else(|| {
                                unsafe_tarball(shown, "a pax size that is not a number".into())
                            })?);
                        }
                        key if key.starts_with(b"GNU.sparse") => {
                            return Err(unsafe_tarball(shown, "a sparse file".into()));
                        }
                        _ => {}
                    }
                }
                continue;
            }
            tar::EntryType::XGlobalHeader => {
                // `git archive` records its commit as a comment; any other
                // global record would change how later entries read.
                let data = read_extension(&mut entry, shown)?;
                for record in tar::PaxExtensions::new(&data) {
                    let record = record.map_err(|e| tar_unreadable(shown, e))?;
                    if record.key_bytes() != b"comment" {
                        return Err(unsafe_tarball(
                            shown,
                            format!(
                                "a pax global header setting {:?}",
                                String::from_utf8_lossy(record.key_bytes())
                            ),
                        ));
                    }
                }
                continue;
            }
            // The link it names for the next entry is refused there.
            tar::EntryType::GNULongLink => {
                read_extension(&mut entry, shown)?;
                continue;
            }
            _ => {}
        }
        let name = long_name
            .take()
            .unwrap_or_else(|| entry.header().path_bytes().into_owned());
        let shown_name = String::from_utf8_lossy(&name).into_owned();
        let refuse = |why: String| unsafe_tarball(shown, format!("entry {shown_name:?}: {why}"));
        let kind = entry_kind(kind).map_err(|what| {
            refuse(format!(
                "{what}: only regular files and directories are unpacked"
            ))
        })?;
        let parts = entry_path(&name).map_err(refuse)?;
        let size = entry.size();
        if let Some(declared) = pax_size.take()
            && declared != size
        {
            return Err(refuse(format!(
                "its pax size {declared} is not its header's {size}"
            )));
        }
        let path = parts
            .iter()
            .fold(into.to_path_buf(), |p, part| p.join(part));
        match kind {
            EntryKind::Directory => std::fs::create_dir_all(&path)
                .map_err(|e| refuse(format!("cannot be made a directory: {e}")))?,
            EntryKind::File => {
                if parts.is_empty() {
                    return Err(refuse("a file without a name".into()));
                }
                if size > MAX_FILE_BYTES {
                    return Err(refuse(format!(
                        "{size} bytes, more than the {MAX_FILE_BYTES} a bundle file may have"
                    )));
                }
                total = total.saturating_add(size);
                if total > limits.max_unpacked_bytes {
                    return Err(unsafe_tarball(
                        shown,
                        format!("unpacks to more than {} bytes", limits.max_unpacked_bytes),
                    ));
                }
                budget.charge(size).map_err(|e| write_error(&path, e))?;
                write_entry(&mut entry, &path, size).map_err(|e| match e.kind() {
                    io::ErrorKind::AlreadyExists => refuse("appears twice".into()),
                    io::ErrorKind::NotADirectory => refuse("its parent is a file".into()),
                    _ => store_error(format!("{}: {e}", path.display())),
                })?;
            }
        }
    }
    Ok(())
}

/// Writes an entry's data to a new file (0644, whatever the tarball says:
/// no set-id or executable bits come along).
fn write_entry(entry: &mut impl Read, path: &Path, size: u64) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)?;
    let copied = io::copy(&mut entry.take(size), &mut file)?;
    if copied != size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the tarball ends {} bytes into a {size}-byte file", copied),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// HTTP.

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<hyper::body::Bytes>,
>;

/// An http and https client: TLS on rustls with the ring provider and the
/// system's root certificates (`rustls-native-certs`, which honours
/// `SSL_CERT_FILE` and `SSL_CERT_DIR`). No roots is not an error until an
/// https URL is fetched: a plain http mirror needs none.
fn http_client(limits: &FetchLimits) -> Result<HttpClient, SourceError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        tracing::warn!(
            errors = ?native.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "no system root certificates: https downloads will fail"
        );
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SourceError::Unavailable(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(limits.connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
    )
}

/// An error and its causes, `: `-separated (hyper's own says only
/// "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Downloads `url` to the new file `to`, following a few redirects, while
/// hashing it; within `limits.timeout` as a whole. Returns the sha256 and
/// size.
async fn download(
    url: &hyper::Uri,
    to: &Path,
    limits: &FetchLimits,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    let shown = redact(&url.to_string());
    let client = http_client(limits)?;
    let work = async {
        let mut url = url.clone();
        for _ in 0..=limits.max_redirects {
            let here = redact(&url.to_string());
            let request = hyper::Request::get(url.clone())
                .header(
                    hyper::header::USER_AGENT,
                    concat!("gpu-operator/", env!("CARGO_PKG_VERSION")),
                )
                .body(http_body_util::Empty::new())
                .map_err(|e| SourceError::Invalid(format!("{here}: {e}")))?;
            let response = client.request(request).await.map_err(|e| {
                SourceError::Unavailable(format!("GET {here}: {}", error_chain(&e)))
            })?;
            let status = response.status();
            if status.is_redirection() && status != hyper::StatusCode::NOT_MODIFIED {
                let location = response
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| {
                        SourceError::Unavailable(format!("GET {here}: {status} without a Location"))
                    })?;
                url = resolve_redirect(&url, location).map_err(|why| {
                    SourceError::Unavailable(format!("GET {here}: {status}: {why}"))
                })?;
                tracing::debug!(from = %here, to = %redact(&url.to_string()), "redirected");
                continue;
            }
            if !status.is_success() {
                return Err(SourceError::Unavailable(format!("GET {here}: {status}")));
            }
            let declared = response
                .headers()
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limits.max_tarball_bytes) {
                return Err(too_big(&here, limits.max_tarball_bytes));
            }
            if let Some(declared) = declared {
                budget
                    .check_room(declared)
                    .map_err(|e| write_error(to, e))?;
            }
            return save_body(
                response.into_body(),
                to,
                limits.max_tarball_bytes,
                &here,
                budget,
            )
            .await;
        }
        Err(SourceError::Unavailable(format!(
            "GET {shown}: more than {} redirects",
            limits.max_redirects
        )))
    };
    tokio::time::timeout(limits.timeout, work)
        .await
        .map_err(|_| {
            SourceError::Unavailable(format!(
                "GET {shown}: not done within {} s",
                limits.timeout.as_secs()
            ))
        })?
}

/// Streams a response body into the new file `to` while hashing it.
async fn save_body(
    mut body: hyper::body::Incoming,
    to: &Path,
    max: u64,
    shown: &str,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    let file_error = |e: io::Error| store_error(format!("{}: {e}", to.display()));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .await
        .map_err(file_error)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| SourceError::Unavailable(format!("GET {shown}: {}", error_chain(&e))))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        size += data.len() as u64;
        if size > max {
            return Err(too_big(shown, max));
        }
        budget
            .charge(data.len() as u64)
            .map_err(|e| write_error(to, e))?;
        context.update(&data);
        file.write_all(&data).await.map_err(file_error)?;
    }
    file.flush().await.map_err(file_error)?;
    Ok((hex(context.finish().as_ref()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "6.8.0-49-generic";

    #[test]
    fn tags_name_os_kernel_and_version() {
        let tag = parse_image_tag("ubuntu-22.04-6.8.0-49-generic-6.12.12").unwrap();
        assert_eq!(
            tag,
            ImageTag {
                os: "ubuntu".into(),
                os_version: "22.04".into(),
                kernel_release: KERNEL.into(),
                version: "6.12.12".into(),
            }
        );
        let rhel = parse_image_tag(
            "registry.local:5000/amd/amdgpu-driver:rhel-9.4-5.14.0-427.13.1.el9_4.x86_64-6.2.2",
        )
        .unwrap();
        assert_eq!(rhel.kernel_release, "5.14.0-427.13.1.el9_4.x86_64");
        assert_eq!(rhel.version, "6.2.2");
        assert_eq!(
            parse_image_tag("ubuntu-24.04-6.8.0-6.3")
                .unwrap()
                .kernel_release,
            "6.8.0"
        );
    }

    #[test]
    fn malformed_tags_say_what_is_wrong() {
        for (tag, says) in [
            ("ubuntu-22.04-6.12.12", "too few"),
            ("ubuntu-22.04--6.12.12", "too few"),
            ("22.04-ubuntu-6.8.0-6.12.12", "OS"),
            ("ubuntu-jammy-6.8.0-6.12.12", "OS version"),
            ("ubuntu-22.04-generic-6.12.12", "kernel"),
            ("ubuntu-22.04-6.8.0-generic-latest", "driver version"),
            ("ubuntu-22.04-6.8.0 x-6.12.12", "not a tag"),
            ("ubuntu-22.04-6.8.0/../x-6.12.12", "without a tag"),
            ("amd/amdgpu-driver", "without a tag"),
            ("amd/amdgpu-driver@sha256:abcd", "digest"),
            ("", "not a tag"),
        ] {
            let why = parse_image_tag(tag).unwrap_err();
            assert!(why.contains(says), "{tag:?}: {why}");
            assert!(
                why.contains("expected <os>-<osver>-<kernel>-<version>"),
                "{why}"
            );
        }
    }

    #[test]
    fn bundle_names_are_one_safe_component() {
        assert_eq!(
            bundle_name("6.12.12", KERNEL).unwrap(),
            "6.12.12-6.8.0-49-generic"
        );
        for (version, kernel) in [
            ("../x", KERNEL),
            (".hidden", KERNEL),
            ("6.12 12", KERNEL),
            ("", KERNEL),
            ("6.12.12", "a/b"),
            ("6.12.12", ".."),
        ] {
            assert!(
                bundle_name(version, kernel).is_err(),
                "{version:?} {kernel:?}"
            );
        }
    }

    #[test]
    fn sha256_text_is_64_hex_digits_in_either_case() {
        let upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        assert_eq!(parse_sha256(upper).unwrap(), upper.to_ascii_lowercase());
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }

    #[test]
    fn the_closure_follows_modules_dep_transitively_and_stays_inside() {
        let text = "\
updates/dkms/amdgpu.ko.xz: updates/dkms/amdttm.ko.xz kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst
updates/dkms/amdttm.ko.xz:
kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst: kernel/drivers/gpu/drm/drm_kms_helper.ko.zst
kernel/drivers/gpu/drm/drm_kms_helper.ko.zst:
kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko.zst:
";
        assert_eq!(
            amdgpu_closure(text, KERNEL).unwrap(),
            [
                "updates/dkms/amdgpu.ko.xz",
                "updates/dkms/amdttm.ko.xz",
                "kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst",
                "kernel/drivers/gpu/drm/drm_kms_helper.ko.zst",
            ]
        );
        assert!(amdgpu_closure("kernel/e1000e.ko:\n", KERNEL).is_err());
        let escaping = "updates/amdgpu.ko: ../../../etc/evil.ko\n";
        let why = amdgpu_closure(escaping, KERNEL).unwrap_err();
        assert!(why.contains("evil.ko"), "{why}");
    }

    #[test]
    fn locations_are_http_urls_or_absolute_paths() {
        assert!(matches!(
            parse_location("https://mirror.example/b.tar.zst"),
            Ok(Location::Url(_))
        ));
        assert!(matches!(
            parse_location("HTTP://h/b.tar"),
            Ok(Location::Url(_))
        ));
        assert_eq!(
            parse_location("/srv/b.tar.gz"),
            Ok(Location::Path("/srv/b.tar.gz".into()))
        );
        assert!(
            parse_location("ftp://h/b.tar")
                .unwrap_err()
                .contains("ftp://")
        );
        assert!(parse_location("b.tar").is_err());
        assert!(parse_location("http:///b.tar").is_err());
    }

    #[test]
    fn shown_sources_carry_no_credentials_or_query() {
        assert_eq!(
            redact("https://user:secret@mirror.example:8443/b.tar.gz?X-Amz-Signature=abc#f"),
            "https://mirror.example:8443/b.tar.gz"
        );
        assert_eq!(redact("/srv/b.tar"), "/srv/b.tar");
    }

    #[test]
    fn redirects_resolve_against_the_url_that_answered() {
        let from: hyper::Uri = "http://127.0.0.1:8080/a/b/old.tar".parse().unwrap();
        for (location, to) in [
            ("/new.tar", "http://127.0.0.1:8080/new.tar"),
            ("new.tar", "http://127.0.0.1:8080/a/b/new.tar"),
            ("//other:81/x.tar", "http://other:81/x.tar"),
            ("https://cdn.example/x.tar", "https://cdn.example/x.tar"),
        ] {
            assert_eq!(resolve_redirect(&from, location).unwrap().to_string(), to);
        }
        assert!(resolve_redirect(&from, "file:///etc/passwd").is_err());
    }

    #[test]
    fn compression_is_told_by_the_first_bytes() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(Compression::sniff(b"\xfd7zXZ\0"), Compression::Xz);
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::sniff(b"manifest"), Compression::None);
        assert_eq!(Compression::sniff(b""), Compression::None);
    }

    #[test]
    fn only_plain_relative_paths_of_files_and_directories_unpack() {
        assert_eq!(entry_path(b"./lib/modules/").unwrap(), ["lib", "modules"]);
        assert_eq!(
            entry_path(b"b//manifest.json").unwrap(),
            ["b", "manifest.json"]
        );
        assert!(entry_path(b"./").unwrap().is_empty());
        for (bad, says) in [
            (&b"/etc/passwd"[..], "absolute"),
            (b"b/../../etc/passwd", ".."),
            (b"..", ".."),
            (b"b/\xff", "UTF-8"),
        ] {
            assert!(entry_path(bad).unwrap_err().contains(says), "{bad:?}");
        }
        use tar::EntryType as T;
        assert_eq!(entry_kind(T::Regular), Ok(EntryKind::File));
        assert_eq!(entry_kind(T::Directory), Ok(EntryKind::Directory));
        for (kind, says) in [
            (T::Symlink, "symbolic link"),
            (T::Link, "hard link"),
            (T::Char, "device"),
            (T::Block, "device"),
            (T::Fifo, "FIFO"),
            (T::GNUSparse, "sparse"),
            (T::new(b'Z'), "type 'Z'"),
        ] {
            assert!(entry_kind(kind).unwrap_err().contains(says), "{kind:?}");
        }
    }

    /// A tar stream of `(path, bytes)` files, written raw so that hostile
    /// names go in unchecked.
    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            builder.append(&header, *bytes).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn unpack_bytes(
        tar: &[u8],
        limits: &FetchLimits,
    ) -> (tempfile::TempDir, Result<(), SourceError>) {
        let dir = tempfile::tempdir().unwrap();
        let unlimited = DiskBudget::new(dir.path(), u64::MAX, 0);
        let result = unpack_tar(tar, dir.path(), "t.tar", limits, &unlimited);
        (dir, result)
    }

    fn refused_reason(result: Result<(), SourceError>) -> String {
        match result {
            Err(SourceError::Refused(refusal)) => format!("{}: {refusal}", refusal.reason()),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn unpacking_stays_within_its_caps_and_its_directory() {
        let files: &[(&str, &[u8])] = &[
            ("b/manifest.json", b"{}"),
            ("b/firmware/x.bin", b"0123456789"),
        ];
        let (dir, result) = unpack_bytes(&tar_of(files), &FetchLimits::default());
        result.unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("b/firmware/x.bin")).unwrap(),
            b"0123456789"
        );

        let small = FetchLimits {
            max_unpacked_bytes: 11,
            ..FetchLimits::default()
        };
        let why = refused_reason(unpack_bytes(&tar_of(files), &small).1);
        assert!(
            why.starts_with("UnsafeTarball") && why.contains("more than 11 bytes"),
            "{why}"
        );
        let few = FetchLimits {
            max_entries: 1,
            ..FetchLimits::default()
        };
        let why = refused_reason(unpack_bytes(&tar_of(files), &few).1);
        assert!(why.contains("more than 1 entries"), "{why}");

        let twice: &[(&str, &[u8])] = &[("a", b"1"), ("./a", b"2")];
        let why = refused_reason(unpack_bytes(&tar_of(twice), &FetchLimits::default()).1);
        assert!(why.contains("appears twice"), "{why}");

        let outside = tempfile::tempdir().unwrap();
        let escape = format!(
            "../{}/evil",
            outside.path().file_name().unwrap().to_str().unwrap()
        );
        let why =
            refused_reason(unpack_bytes(&tar_of(&[(&escape, b"x")]), &FetchLimits::default()).1);
        assert!(why.contains("`..`"), "{why}");
        assert!(!outside.path().join("evil").exists());
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&vec![0u8; 1 << 20]).unwrap();
        let tarball = dir.path().join("bomb");
        std::fs::write(&tarball, encoder.finish().unwrap()).unwrap();
        let into = dir.path().join("into");
        std::fs::create_dir(&into).unwrap();
        let limits = FetchLimits {
            max_unpacked_bytes: 1000,
            max_entries: 1,
            ..FetchLimits::default()
        };
        let unlimited = DiskBudget::new(dir.path(), u64::MAX, 0);
        let result = unpack(
            &tarball,
            &dir.path().join("scratch"),
            &into,
            "bomb",
            &limits,
            &unlimited,
        );
        let why = refused_reason(result);
        assert!(
            why.starts_with("UnsafeTarball") && why.contains("decompresses to more than"),
            "{why}"
        );
    }

    /// A gzipped tarball of one 64 KiB file in `dir`, and its path.
    fn gzipped_tarball(dir: &Path) -> PathBuf {
        let tar = tar_of(&[("bundle/big.bin", &[7u8; 64 * 1024])]);
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&tar).unwrap();
        let tarball = dir.join("tarball");
        std::fs::write(&tarball, encoder.finish().unwrap()).unwrap();
        tarball
    }

    #[test]
    fn each_work_file_goes_once_read_so_the_work_holds_two_stages_at_most() {
        let dir = tempfile::tempdir().unwrap();
        let tarball = gzipped_tarball(dir.path());
        let compressed = std::fs::metadata(&tarball).unwrap().len();
        let into = dir.path().join("into");
        std::fs::create_dir(&into).unwrap();
        // Room for the decompressed tar (64 KiB and its headers) and the
        // unpacked file, not for all three stages.
        let budget = DiskBudget::new(dir.path(), 2 * 64 * 1024 + 4096, 0);
        budget.charge(compressed).unwrap();
        let scratch = dir.path().join("scratch");
        let limits = FetchLimits::default();
        unpack(&tarball, &scratch, &into, "t", &limits, &budget).unwrap();
        assert!(!tarball.exists() && !scratch.exists(), "work files removed");
        assert_eq!(budget.used(), 64 * 1024, "only the unpacked file is held");
        assert!(into.join("bundle/big.bin").is_file());
    }

    #[test]
    fn a_fetch_that_would_not_fit_stops_with_the_store_full() {
        let dir = tempfile::tempdir().unwrap();
        let tarball = gzipped_tarball(dir.path());
        let into = dir.path().join("into");
        std::fs::create_dir(&into).unwrap();
        let tight = DiskBudget::new(dir.path(), 100 * 1024, 0);
        let result = unpack(
            &tarball,
            &dir.path().join("scratch"),
            &into,
            "t",
            &FetchLimits::default(),
            &tight,
        );
        let Err(SourceError::NoSpace(why)) = result else {
            panic!("expected NoSpace: {result:?}");
        };
        assert!(why.contains("more than the 102400"), "{why}");
        assert_eq!(SourceError::NoSpace(why).reason(), "BundleStoreFull");
    }

    /// The import's check before copying sizes each file when it looks; a
    /// file that grows afterwards is still stopped by the charge as it is
    /// copied, before more than the bound is written.
    #[test]
    fn an_import_copy_stops_at_the_budget_as_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/staging/fw.bin", vec![7u8; 200 * 1024])
            .unwrap();
        let tight = DiskBudget::new(dir.path(), 100 * 1024, 0);
        let to = dir.path().join("work/fw.bin");
        let result = copy_file(&host, "/staging/fw.bin", &to, &tight);
        let Err(SourceError::NoSpace(why)) = result else {
            panic!("expected NoSpace: {result:?}");
        };
        assert!(why.contains("102400 bytes allowed"), "{why}");
        let written = std::fs::metadata(&to).unwrap().len();
        assert!(written <= 100 * 1024, "{written} bytes written");
    }
}
