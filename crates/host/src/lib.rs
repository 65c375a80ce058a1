//! Host access: every file this program reads or writes on the host goes through
//! a [`HostRoot`].
//!
//! The root is `/` on a bare-metal host, typically `/host` inside a container that
//! mounts the host's `/sys` and `/dev`, and a temporary directory in tests and demos,
//! where `gpu-operator simulate` has written a tree that mirrors the kernel's layout.
//! Code elsewhere names host paths exactly as they appear on a real host
//! (`/sys/class/kfd/...`) and never joins the root itself.
//!
//! This module owns path mapping, bounded reads and the parsing of single-value
//! sysfs attributes. It must not know what any file means: that belongs to the
//! modules that read them. It is near the bottom of the module order, a
//! crate of its own (`gpu-operator-host`, re-exported by `gpu-operator` as
//! `host`) that cannot import the crates above it; every `unsafe` block in it
//! (libc calls and the raw values they take) has its SAFETY note. [`reader`] reads files with a
//! deadline on a thread pool of its own, for discovery, health and metrics.
//!
//! [`HostRead`] is the read interface the agent's long-running paths use
//! (discovery, the change stream's fingerprint). It is implemented only by
//! deadline-bounded readers (discovery's `BoundedHost`, over the thread pool of
//! [`reader::BoundedReader`]), never by [`HostRoot`] itself, so that no such
//! path can block on a hung file.
//! A read that misses its deadline is an [`io::ErrorKind::TimedOut`] error
//! naming the file ([`HostError::is_timeout`]).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod alarm;
pub mod descriptors;
pub mod inotify;
pub mod reader;

use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// Upper bound for one attribute read. sysfs attributes fit in a page; the bound
/// keeps a misbehaving file (or a device node mistaken for one) from filling memory.
const MAX_ATTR_BYTES: u64 = 64 * 1024;

/// An error from host access. It always names the host path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot parse {value:?} as {expected}")]
    Parse {
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
}

impl HostError {
    /// True when the file or one of its parents does not exist: the normal way for
    /// an optional attribute to be absent, or for a device to vanish mid-scan.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// True when the read got no answer in time, or was refused because an
    /// earlier read of the same file still has not returned.
    pub fn is_timeout(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.kind() == io::ErrorKind::TimedOut)
    }

    /// A read of `path` that got no answer in time; `why` says how.
    pub fn timed_out(path: PathBuf, why: impl Into<String>) -> Self {
        HostError::Io {
            path,
            source: io::Error::new(io::ErrorKind::TimedOut, why.into()),
        }
    }

    /// An answer of another kind than asked for (a listing for a read):
    /// only a bug in a reader gives one, and a missing value is the safe
    /// outcome.
    pub fn wrong_answer(path: PathBuf) -> Self {
        HostError::Io {
            path,
            source: io::ErrorKind::InvalidData.into(),
        }
    }

    fn io(path: &Path, source: io::Error) -> Self {
        HostError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// The root under which host paths are resolved.
/// Where writes of kernel attributes go: the kernel itself on a real host
/// ([`HostRoot::store_attr`]); the simulator's model of the driver on a
/// simulated one, which answers as the kernel would. The one way this
/// program changes a kernel setting through sysfs.
pub trait AttrStore: Send + Sync + std::fmt::Debug {
    /// Stores `value` in the attribute at `host_path`.
    fn store(&self, host_path: &str, value: &str) -> Result<()>;

    /// Makes the stores so far take effect where this store defers their
    /// consequences: the simulated driver lays a host's partitions out once
    /// per batch of mode writes, not once per write. The kernel's own
    /// attributes take effect as they are written: nothing to do.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
}

/// The real kernel's attributes under a host root.
#[derive(Clone, Debug)]
pub struct Sysfs(pub HostRoot);

impl AttrStore for Sysfs {
    fn store(&self, host_path: &str, value: &str) -> Result<()> {
        self.0.store_attr(host_path, value)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory that stands for the host's `/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps a host path (`/sys/bus/pci`) to where it lives under this root.
    /// `..` components are dropped, so a path can never climb out of the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        for component in host_path.as_ref().components() {
            if let Component::Normal(part) = component {
                out.push(part);
            }
        }
        out
    }

    pub fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        self.path(host_path).exists()
    }

    /// Reads a whole (small) file as UTF-8, at most 64 KiB.
    pub fn read_string(&self, host_path: impl AsRef<Path>) -> Result<String> {
        let path = self.path(host_path);
        let file = open_to_read(&path).map_err(|e| HostError::io(&path, e))?;
        let mut buf = String::new();
        file.take(MAX_ATTR_BYTES)
            .read_to_string(&mut buf)
            .map_err(|e| HostError::io(&path, e))?;
        Ok(buf)
    }

    /// Opens an attribute to be read again later through [`OpenAttr::reread`],
    /// and reads its bytes once, at most 64 KiB. The file stays open only if
    /// it is a regular file (sysfs attributes are); anything else (a FIFO, a
    /// device node) is read once and `None` is returned for it. Text
    /// attributes go through [`HostRoot::attr_str`].
    pub fn open_attr(&self, host_path: impl AsRef<Path>) -> Result<(Vec<u8>, Option<OpenAttr>)> {
        let path = self.path(host_path);
        let file = open_to_read(&path).map_err(|e| HostError::io(&path, e))?;
        let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
        if !regular {
            return Ok((read_bounded(&file, &path)?, None));
        }
        let attr = OpenAttr {
            replaceable: !on_sysfs(&file),
            file,
            path,
        };
        match attr.reread()? {
            Some(bytes) => Ok((bytes, Some(attr))),
            // Replaced between open and read: read the new file once.
            None => {
                let file = open_to_read(&attr.path).map_err(|e| HostError::io(&attr.path, e))?;
                Ok((read_bounded(&file, &attr.path)?, None))
            }
        }
    }

    /// An attribute's bytes, read from `host_path`, as the text
    /// [`HostRoot::read_attr`] would give: one allocation, of the trimmed
    /// value; the path is only built for an error.
    pub fn attr_str(&self, host_path: impl AsRef<Path>, bytes: &[u8]) -> Result<String> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.trim().to_owned()),
            Err(e) => Err(HostError::io(
                &self.path(host_path),
                io::Error::new(io::ErrorKind::InvalidData, e),
            )),
        }
    }

    /// Reads a sysfs attribute: the file's content with surrounding white space removed.
    pub fn read_attr(&self, host_path: impl AsRef<Path>) -> Result<String> {
        self.read_string(host_path).map(|s| s.trim().to_owned())
    }

    /// Reads an optional attribute: `Ok(None)` when the file is absent or empty.
    pub fn read_optional_attr(&self, host_path: impl AsRef<Path>) -> Result<Option<String>> {
        match self.read_attr(host_path) {
            Ok(value) if value.is_empty() => Ok(None),
            Ok(value) => Ok(Some(value)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads an attribute and parses it with `FromStr`; `expected` names the type in errors.
    pub fn read_parsed<T: FromStr>(
        &self,
        host_path: impl AsRef<Path>,
        expected: &'static str,
    ) -> Result<T> {
        let host_path = host_path.as_ref();
        let value = self.read_attr(host_path)?;
        value.parse().map_err(|_| HostError::Parse {
            path: self.path(host_path),
            value,
            expected,
        })
    }

    /// Reads a hexadecimal attribute such as `0x1002` (the `0x` is optional).
    pub fn read_hex(&self, host_path: impl AsRef<Path>) -> Result<u64> {
        let host_path = host_path.as_ref();
        let value = self.read_attr(host_path)?;
        parse_hex(&value).ok_or_else(|| HostError::Parse {
            path: self.path(host_path),
            value,
            expected: "a hexadecimal number",
        })
    }

    /// Opens a file of any size to be read from its start as a stream, so
    /// that a big file (a kernel module) is never held in memory: reading
    /// more than `max_bytes` from it is an error (`InvalidData`, naming the
    /// file) instead of more bytes.
    pub fn open_capped(&self, host_path: impl AsRef<Path>, max_bytes: u64) -> Result<CappedFile> {
        let path = self.path(host_path);
        let file = fs::File::open(&path).map_err(|e| HostError::io(&path, e))?;
        Ok(CappedFile {
            file: file.take(max_bytes.saturating_add(1)),
            path,
            max_bytes,
            read: 0,
        })
    }

    /// Reads a whole file of any size through [`HostRoot::open_capped`],
    /// handing it to `each` in chunks. Returns the bytes read.
    pub fn read_chunks(
        &self,
        host_path: impl AsRef<Path>,
        max_bytes: u64,
        mut each: impl FnMut(&[u8]),
    ) -> Result<u64> {
        let mut file = self.open_capped(host_path, max_bytes)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match file.read(&mut buf) {
                Ok(0) => return Ok(file.read),
                Ok(n) => each(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(HostError::io(&file.path, e)),
            }
        }
    }

    /// Whether `host_path`, with every symbolic link resolved, is `dir` or
    /// inside it (also resolved): a link that points out of `dir` is not.
    /// Links resolve as the kernel resolves them for this process, so an
    /// absolute link under a root other than `/` points outside the root
    /// and is not inside. A missing path is a not-found error.
    pub fn resolves_within(
        &self,
        dir: impl AsRef<Path>,
        host_path: impl AsRef<Path>,
    ) -> Result<bool> {
        let dir = self.path(dir);
        let path = self.path(host_path);
        let dir = fs::canonicalize(&dir).map_err(|e| HostError::io(&dir, e))?;
        let resolved = fs::canonicalize(&path).map_err(|e| HostError::io(&path, e))?;
        Ok(resolved.starts_with(&dir))
    }

    /// Lists the names in a directory, sorted. Names that are not UTF-8 are skipped:
    /// no kernel object this program cares about has one.
    pub fn list_dir(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>> {
        let path = self.path(host_path);
        let entries = fs::read_dir(&path).map_err(|e| HostError::io(&path, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| HostError::io(&path, e))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Like [`HostRoot::list_dir`], but an absent directory is an empty list.
    pub fn list_dir_or_empty(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>> {
        match self.list_dir(host_path) {
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            other => other,
        }
    }

    /// Writes a file, creating its parent directories.
    pub fn write(&self, host_path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> Result<()> {
        let path = self.path(host_path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| HostError::io(parent, e))?;
        }
        fs::write(&path, contents).map_err(|e| HostError::io(&path, e))
    }

    /// Writes `value` to an existing kernel attribute in one `write`, as
    /// `echo value > attr` does: the file is never created or truncated, and
    /// the kernel's answer (`EINVAL` for a value it refuses, `EBUSY`) is the
    /// error. May block as long as the driver takes to act on it; callers
    /// bound it.
    pub fn store_attr(&self, host_path: impl AsRef<Path>, value: &str) -> Result<()> {
        use std::io::Write as _;
        let path = self.path(host_path);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| HostError::io(&path, e))?;
        file.write_all(value.as_bytes())
            .map_err(|e| HostError::io(&path, e))
    }

    pub fn create_dir_all(&self, host_path: impl AsRef<Path>) -> Result<()> {
        let path = self.path(host_path);
        fs::create_dir_all(&path).map_err(|e| HostError::io(&path, e))
    }

    /// Removes a file or a whole directory tree; absent is fine.
    pub fn remove_all(&self, host_path: impl AsRef<Path>) -> Result<()> {
        let path = self.path(host_path);
        let result = match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(HostError::io(&path, e)),
            _ => Ok(()),
        }
    }

    /// The target of the symbolic link at `host_path`, as a host path. An
    /// absolute target is taken as it is (the kernel's `/proc/<pid>/fd/<n>`
    /// links name the opened file that way); a relative one, as
    /// [`HostRoot::symlink`] writes them, is resolved lexically against the
    /// link's directory.
    pub fn read_link(&self, host_path: impl AsRef<Path>) -> Result<String> {
        let link = host_path.as_ref();
        let path = self.path(link);
        let target = fs::read_link(&path).map_err(|e| HostError::io(&path, e))?;
        if target.is_absolute() {
            return Ok(target.to_string_lossy().into_owned());
        }
        let mut parts: Vec<String> = link
            .parent()
            .into_iter()
            .flat_map(|p| p.components())
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        for component in target.components() {
            match component {
                std::path::Component::ParentDir => {
                    parts.pop();
                }
                std::path::Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
                _ => {}
            }
        }
        Ok(format!("/{}", parts.join("/")))
    }

    /// Creates a symbolic link at `link` pointing at the host path `target`. The link
    /// is written relative, as sysfs writes its own, so that it resolves inside this
    /// root too.
    pub fn symlink(&self, target: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let link_host = link.as_ref();
        let relative = relative_link(link_host, target.as_ref());
        let path = self.path(link_host);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| HostError::io(parent, e))?;
        }
        // Replacing an existing link keeps `simulate` idempotent.
        if fs::symlink_metadata(&path).is_ok() {
            fs::remove_file(&path).map_err(|e| HostError::io(&path, e))?;
        }
        std::os::unix::fs::symlink(&relative, &path).map_err(|e| HostError::io(&path, e))
    }

    /// Renames `from` to `to` (host paths on one filesystem) in one step: a
    /// reader sees the old name or the new one, never a partial tree. A
    /// directory `to` that exists and is not empty is an error.
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        let (from, to) = (self.path(from), self.path(to));
        fs::rename(&from, &to).map_err(|e| HostError::io(&to, e))
    }

    /// Swaps what the host paths `a` and `b` name, in one step
    /// (`renameat2(RENAME_EXCHANGE)`): a reader of either path sees the old
    /// tree or the new one, never none.
    pub fn exchange(&self, a: impl AsRef<Path>, b: impl AsRef<Path>) -> Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let (a, b) = (self.path(a), self.path(b));
        let c_path = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|e| HostError::io(p, io::Error::new(io::ErrorKind::InvalidInput, e)))
        };
        let (c_a, c_b) = (c_path(&a)?, c_path(&b)?);
        // SAFETY: both are NUL-terminated paths that live across the call.
        let done = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                c_a.as_ptr(),
                libc::AT_FDCWD,
                c_b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if done == 0 {
            Ok(())
        } else {
            Err(HostError::io(&b, io::Error::last_os_error()))
        }
    }
}

/// A file opened by [`HostRoot::open_capped`]: a [`Read`] that fails
/// rather than give more than its cap.
#[derive(Debug)]
pub struct CappedFile {
    file: io::Take<fs::File>,
    path: PathBuf,
    max_bytes: u64,
    read: u64,
}

impl CappedFile {
    /// Where it was opened (under the root), for errors.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Read for CappedFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read += n as u64;
        if self.read > self.max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than the {} bytes allowed", self.max_bytes),
            ));
        }
        Ok(n)
    }
}

/// An attribute file kept open between reads, so that reading it again costs
/// one `pread` from its start instead of a path walk, an open, two reads and a
/// close. sysfs regenerates an attribute's value on every read from offset 0
/// (which is how `lm-sensors` and node exporters poll), so a kept descriptor
/// never serves a stale value there. A file on any other filesystem may be
/// replaced by a rename (the simulator writes each file so, as a writer that
/// wants atomic updates does); the old inode then has no link left, which
/// [`OpenAttr::reread`] checks before reading.
#[derive(Debug)]
pub struct OpenAttr {
    file: fs::File,
    /// Where it was opened (under the root), for errors.
    path: PathBuf,
    /// Not on sysfs: may have been replaced by a rename or removed.
    replaceable: bool,
}

impl OpenAttr {
    /// Off sysfs: the file may be replaced by a rename, or removed, while
    /// open, and each [`OpenAttr::reread`] checks its links first.
    pub fn is_replaceable(&self) -> bool {
        self.replaceable
    }

    /// The path still names the file this descriptor reads (the same
    /// device and inode).
    pub fn still_at_its_path(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), fs::metadata(&self.path)) {
            (Ok(open), Ok(now)) => open.dev() == now.dev() && open.ino() == now.ino(),
            _ => false,
        }
    }

    /// The caller learns of the file's replacement another way (an inotify
    /// watch on its directory, set up before the file was opened), so rereads
    /// skip the per-read link check.
    pub fn trusting_a_watch(mut self) -> Self {
        self.replaceable = false;
        self
    }

    /// The file's bytes now, at most 64 KiB; `None` when the file was removed
    /// or replaced since it was opened (open it again). An error (a sysfs
    /// attribute whose device went away answers `ENODEV`) also means this
    /// descriptor is done with.
    pub fn reread(&self) -> Result<Option<Vec<u8>>> {
        let mut buf = Vec::new();
        Ok(self.reread_into(&mut buf)?.map(|len| {
            buf.truncate(len);
            buf
        }))
    }

    /// [`OpenAttr::reread`] into a buffer the caller keeps between reads:
    /// the value is `buf[..len]` for the returned `len`. A reader that polls
    /// hundreds of attributes a second then allocates (and zeroes) no page
    /// per read; `buf` grows once to the largest value seen, at most 64 KiB.
    pub fn reread_into(&self, buf: &mut Vec<u8>) -> Result<Option<usize>> {
        use std::os::unix::fs::{FileExt, MetadataExt};
        if self.replaceable {
            let meta = self
                .file
                .metadata()
                .map_err(|e| HostError::io(&self.path, e))?;
            if meta.nlink() == 0 {
                return Ok(None);
            }
        }
        // sysfs attributes fit in a page; a short read is the whole value.
        if buf.len() < ATTR_PAGE {
            buf.resize(ATTR_PAGE, 0);
        }
        let mut len = 0;
        loop {
            let n = self
                .file
                .read_at(&mut buf[len..], len as u64)
                .map_err(|e| HostError::io(&self.path, e))?;
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            if buf.len() as u64 >= MAX_ATTR_BYTES {
                break;
            }
            buf.resize((buf.len() * 2).min(MAX_ATTR_BYTES as usize), 0);
        }
        Ok(Some(len))
    }
}

/// What one read of an attribute asks for first: a page, which every sysfs
/// attribute fits in.
const ATTR_PAGE: usize = 4096;

/// Opens a host file to read it, asking the kernel not to update its access
/// time (`O_NOATIME`). The operator reads the same attributes several times
/// a second for as long as it runs; on a filesystem that keeps access times
/// (the tmpfs of a simulated host; sysfs keeps none) each read would
/// otherwise also write the inode. Only the file's owner or a process with
/// `CAP_FOWNER` may ask that: anyone else opens the file as usual.
fn open_to_read(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => fs::File::open(path),
        opened => opened,
    }
}

/// A whole (small) file from its start, at most 64 KiB.
fn read_bounded(file: &fs::File, path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.take(MAX_ATTR_BYTES)
        .read_to_end(&mut buf)
        .map_err(|e| HostError::io(path, e))?;
    Ok(buf)
}

/// Whether an open file lives on sysfs, whose attributes are never replaced
/// by a rename.
fn on_sysfs(file: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call and `stat` is valid for writes.
    let done = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) };
    done == 0 && stat.f_type == libc::SYSFS_MAGIC
}

/// Whether `path` is on a sysfs mount.
pub fn is_sysfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `stat` is valid for writes.
    let done = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    done == 0 && stat.f_type == libc::SYSFS_MAGIC
}

/// What one request of [`HostRead::read_many`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostOp {
    /// [`HostRead::read_attr`].
    Read,
    /// [`HostRead::exists`].
    Exists,
    /// [`HostRead::list_dir`].
    List,
}

/// The answer to one [`HostOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostAnswer {
    Text(String),
    Exists(bool),
    Names(Vec<String>),
}

/// Answers requests one after the other through `host`'s single-read
/// methods: [`HostRead::read_many`] unless an implementation batches.
pub fn read_each<H: HostRead + ?Sized>(
    host: &H,
    requests: &[(HostOp, &str)],
) -> Vec<Result<HostAnswer>> {
    requests
        .iter()
        .map(|(op, path)| match op {
            HostOp::Read => host.read_attr(path).map(HostAnswer::Text),
            HostOp::Exists => host.exists(path).map(HostAnswer::Exists),
            HostOp::List => host.list_dir(path).map(HostAnswer::Names),
        })
        .collect()
}

/// Reads host files with a deadline. Paths are host paths (`/sys/...`), mapped
/// under [`HostRead::host`]'s root. Every method returns in bounded time.
pub trait HostRead {
    /// The root paths are resolved under (for error messages and mapping).
    fn host(&self) -> &HostRoot;

    /// A sysfs attribute: the file's content (at most 64 KiB) with surrounding
    /// white space removed.
    fn read_attr(&self, host_path: &str) -> Result<String>;

    /// The names in a directory, sorted; a not-found error when it is absent.
    fn list_dir(&self, host_path: &str) -> Result<Vec<String>>;

    fn exists(&self, host_path: &str) -> Result<bool>;

    /// Several requests at once, answered in order, each exactly as its
    /// method answers it. An implementation may hand them all to its threads
    /// at once; this one asks one after the other.
    fn read_many(&self, requests: &[(HostOp, &str)]) -> Vec<Result<HostAnswer>> {
        read_each(self, requests)
    }

    /// `Ok(None)` when the file is absent or empty.
    fn read_optional_attr(&self, host_path: &str) -> Result<Option<String>> {
        match self.read_attr(host_path) {
            Ok(value) if value.is_empty() => Ok(None),
            Ok(value) => Ok(Some(value)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A hexadecimal attribute such as `0x1002` (the `0x` is optional).
    fn read_hex(&self, host_path: &str) -> Result<u64> {
        let value = self.read_attr(host_path)?;
        parse_hex(&value).ok_or_else(|| HostError::Parse {
            path: self.host().path(host_path),
            value,
            expected: "a hexadecimal number",
        })
    }

    /// Like [`HostRead::list_dir`], but an absent directory is an empty list.
    fn list_dir_or_empty(&self, host_path: &str) -> Result<Vec<String>> {
        match self.list_dir(host_path) {
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            other => other,
        }
    }

    /// [`HostRead::read_attr`] of every path in one
    /// [`HostRead::read_many`], answered in order: where the reads go to a
    /// bounded reader, one hand-off to its threads instead of one a file.
    fn read_attrs(&self, paths: &[String]) -> Vec<Result<String>> {
        let requests: Vec<(HostOp, &str)> =
            paths.iter().map(|p| (HostOp::Read, p.as_str())).collect();
        let answers = self.read_many(&requests);
        answers
            .into_iter()
            .zip(paths)
            .map(|(answer, path)| match answer? {
                HostAnswer::Text(text) => Ok(text),
                _ => Err(HostError::wrong_answer(self.host().path(path))),
            })
            .collect()
    }

    /// [`HostRead::list_dir_or_empty`] of every directory in one request,
    /// as [`HostRead::read_attrs`] reads.
    fn list_dirs_or_empty(&self, dirs: &[String]) -> Vec<Result<Vec<String>>> {
        let requests: Vec<(HostOp, &str)> =
            dirs.iter().map(|d| (HostOp::List, d.as_str())).collect();
        let answers = self.read_many(&requests);
        answers
            .into_iter()
            .zip(dirs)
            .map(|(answer, dir)| match answer {
                Ok(HostAnswer::Names(names)) => Ok(names),
                Ok(_) => Err(HostError::wrong_answer(self.host().path(dir))),
                Err(e) if e.is_not_found() => Ok(Vec::new()),
                Err(e) => Err(e),
            })
            .collect()
    }
}

/// Parses `0x1002`, `0X1002` or `1002` as hexadecimal.
pub fn parse_hex(value: &str) -> Option<u64> {
    let digits = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
        .unwrap_or(value);
    u64::from_str_radix(digits, 16).ok()
}

/// The relative path from the directory holding `link` to `target`, both host paths.
fn relative_link(link: &Path, target: &Path) -> PathBuf {
    let normal = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                _ => None,
            })
            .collect()
    };
    let link_dir = {
        let mut parts = normal(link);
        parts.pop();
        parts
    };
    let target = normal(target);
    let common = link_dir
        .iter()
        .zip(target.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..link_dir.len() {
        out.push("..");
    }
    for part in &target[common..] {
        out.push(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_buffer_gives_each_value_whole_and_nothing_of_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = HostRoot::new(dir.path());
        let long = "x".repeat(ATTR_PAGE + 100);
        std::fs::write(dir.path().join("attr"), &long).expect("write");
        let (first, attr) = host.open_attr("/attr").expect("open");
        assert_eq!(first, long.as_bytes());
        let attr = attr.expect("a regular file is kept");
        let mut buf = Vec::new();
        let len = attr
            .reread_into(&mut buf)
            .expect("read")
            .expect("not replaced");
        assert_eq!(&buf[..len], long.as_bytes());
        // Shorter now, written in place: only the new value, no tail of the old.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(dir.path().join("attr"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b" 42\n"))
            .expect("rewrite");
        let len = attr
            .reread_into(&mut buf)
            .expect("read")
            .expect("not replaced");
        assert_eq!(&buf[..len], b" 42\n");
        assert_eq!(host.attr_str("/attr", &buf[..len]).expect("utf-8"), "42");
        let invalid = host
            .attr_str("/attr", &[0xff, 0xfe])
            .expect_err("not UTF-8");
        assert!(invalid.to_string().contains("attr"), "{invalid}");
    }

    #[test]
    fn rename_moves_a_tree_and_exchange_swaps_two() {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = HostRoot::new(dir.path());
        host.write("/store/.work/a/file", "new").expect("write");
        host.write("/store/b/file", "old").expect("write");
        host.exchange("/store/.work/a", "/store/b")
            .expect("exchange");
        assert_eq!(host.read_string("/store/b/file").expect("read"), "new");
        assert_eq!(
            host.read_string("/store/.work/a/file").expect("read"),
            "old"
        );
        host.write("/store/.work/c/file", "c").expect("write");
        let occupied = host
            .rename("/store/.work/c", "/store/b")
            .expect_err("b is not empty");
        assert!(occupied.to_string().contains("store/b"), "{occupied}");
        host.rename("/store/.work/c", "/store/d").expect("rename");
        assert_eq!(host.read_string("/store/d/file").expect("read"), "c");
        assert!(host.exchange("/store/d", "/store/none").is_err());
    }

    #[test]
    fn path_maps_under_root_and_cannot_escape() {
        let host = HostRoot::new("/tmp/h");
        assert_eq!(
            host.path("/sys/bus/pci"),
            PathBuf::from("/tmp/h/sys/bus/pci")
        );
        assert_eq!(host.path("sys/x"), PathBuf::from("/tmp/h/sys/x"));
        assert_eq!(
            host.path("/../../etc/passwd"),
            PathBuf::from("/tmp/h/etc/passwd")
        );
    }

    #[test]
    fn relative_links_resolve_inside_the_root() {
        assert_eq!(
            relative_link(
                Path::new("/sys/bus/pci/drivers/amdgpu/0000:05:00.0"),
                Path::new("/sys/devices/pci0000:00/0000:05:00.0")
            ),
            PathBuf::from("../../../../devices/pci0000:00/0000:05:00.0")
        );
    }

    #[test]
    fn reads_attributes_and_reports_paths_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/a/vendor", "0x1002\n").unwrap();
        host.write("/sys/a/numa_node", "-1\n").unwrap();
        host.write("/sys/a/bad", "zz\n").unwrap();
        assert_eq!(host.read_hex("/sys/a/vendor").unwrap(), 0x1002);
        assert_eq!(
            host.read_parsed::<i32>("/sys/a/numa_node", "an integer")
                .unwrap(),
            -1
        );
        let err = host
            .read_parsed::<u32>("/sys/a/bad", "an integer")
            .unwrap_err();
        assert!(err.to_string().contains("sys/a/bad"), "{err}");
        assert!(!err.is_not_found());
        assert!(host.read_attr("/sys/a/missing").unwrap_err().is_not_found());
        assert_eq!(host.read_optional_attr("/sys/a/missing").unwrap(), None);
    }

    #[test]
    fn chunked_reads_are_whole_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        host.write("/b/module.ko", &data).unwrap();
        let mut seen = Vec::new();
        let n = host
            .read_chunks("/b/module.ko", data.len() as u64, |c| {
                seen.extend_from_slice(c)
            })
            .unwrap();
        assert_eq!((n, &seen), (data.len() as u64, &data));
        let mut seen = 0usize;
        let err = host
            .read_chunks("/b/module.ko", 100_000, |c| seen += c.len())
            .unwrap_err();
        assert!(err.to_string().contains("100000 bytes"), "{err}");
        assert!(seen <= 100_000, "{seen}");
    }

    #[test]
    fn links_out_of_a_directory_do_not_resolve_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/b/firmware/a.bin", "a").unwrap();
        host.write("/outside", "x").unwrap();
        host.symlink("/b/firmware/a.bin", "/b/firmware/inside.bin")
            .unwrap();
        host.symlink("/outside", "/b/firmware/out.bin").unwrap();
        assert!(host.resolves_within("/b", "/b/firmware/a.bin").unwrap());
        assert!(
            host.resolves_within("/b", "/b/firmware/inside.bin")
                .unwrap()
        );
        assert!(!host.resolves_within("/b", "/b/firmware/out.bin").unwrap());
        assert!(
            host.resolves_within("/b", "/b/missing")
                .unwrap_err()
                .is_not_found()
        );
    }

    #[test]
    fn symlinks_are_relative_and_followed() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/devices/x/vendor", "0x1002").unwrap();
        host.symlink("/sys/devices/x", "/sys/bus/pci/drivers/amdgpu/x")
            .unwrap();
        host.symlink("/sys/devices/x", "/sys/bus/pci/drivers/amdgpu/x")
            .unwrap();
        assert_eq!(
            host.read_attr("/sys/bus/pci/drivers/amdgpu/x/vendor")
                .unwrap(),
            "0x1002"
        );
    }

    /// Sets `path`'s access time to two days before its modification time,
    /// which a `relatime` mount updates at the next read.
    fn age_access_time(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let times = [
            libc::timespec {
                tv_sec: (now.as_secs() - 2 * 86_400) as libc::time_t,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: now.as_secs() as libc::time_t,
                tv_nsec: 0,
            },
        ];
        // SAFETY: the path is NUL-terminated; `times` holds two timespecs.
        let done = unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), 0) };
        assert_eq!(done, 0, "{}", io::Error::last_os_error());
    }

    fn access_time(path: &Path) -> i64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).unwrap().atime()
    }

    #[test]
    fn reading_an_attribute_leaves_its_access_time_alone() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/a", "1\n").unwrap();
        let path = host.path("/sys/a");

        // The control: a plain read on this filesystem updates it.
        age_access_time(&path);
        let aged = access_time(&path);
        fs::read(&path).unwrap();
        assert_ne!(access_time(&path), aged, "this mount keeps access times");

        age_access_time(&path);
        let (bytes, kept) = host.open_attr("/sys/a").unwrap();
        assert_eq!(bytes, b"1\n");
        let kept = kept.expect("a regular file stays open");
        assert_eq!(kept.reread().unwrap().unwrap(), b"1\n");
        assert_eq!(host.read_string("/sys/a").unwrap(), "1\n");
        assert_eq!(access_time(&path), aged, "no read wrote the inode");
    }
}
