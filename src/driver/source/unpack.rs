//! Unpacking a tarball: decompressing and writing its entries.
//!
//! It owns the checks on every entry (only plain relative paths of files
//! and directories, each once) and the caps on size and count, charged to
//! the disk budget as bytes are written; it must not decide whether the
//! tarball is wanted (its sha256 is checked before, by [`super::tarball`]).

use std::io::{self, BufRead, Read, Write};
use std::path::Path;

use super::location::FetchLimits;
use super::{SourceError, store_error, write_error};
use crate::driver::bundle::{MAX_FILE_BYTES, Refusal};
use crate::driver::space::DiskBudget;

/// A GNU long name or a pax header is a path and a few times; more is hostile.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

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
pub(super) fn unpack(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
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
}
