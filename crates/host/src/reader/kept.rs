//! Attribute descriptors the reader keeps open between reads of one file,
//! and the inotify watches that tell it when a kept file was replaced.
//!
//! This file owns which descriptors are kept, how many, and when one is
//! dropped and its path opened afresh. It must not start threads or keep
//! deadlines (the reader's pool in `mod.rs` does), nor know what any file
//! means; all paths go through [`HostRoot`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use crate::inotify::{ENTRIES_AND_SELF, Inotify};
use crate::{HostError, HostRoot, OpenAttr};

use super::{Answer, ByPath, Inner, Op, PathKey};

/// Attribute descriptors kept open between reads of the same file (see
/// [`OpenAttr`]): a file the health monitor reads four times a second costs
/// one `pread` each time instead of a path walk, an open, two reads and a
/// close. At most `cap` are kept ([`crate::descriptors`] sets the
/// budget); when full, the least recently read one is closed.
pub(super) struct KeptFiles {
    cap: usize,
    files: HashMap<PathKey, KeptFile, ByPath>,
    /// Counts reads, to order the files by their last one.
    clock: u64,
}

struct KeptFile {
    attr: Arc<OpenAttr>,
    last_read: u64,
}

impl KeptFiles {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            files: HashMap::default(),
            clock: 0,
        }
    }

    fn get(&mut self, path: &PathKey) -> Option<Arc<OpenAttr>> {
        self.clock += 1;
        let kept = self.files.get_mut(path)?;
        kept.last_read = self.clock;
        Some(kept.attr.clone())
    }

    fn keep(&mut self, path: &PathKey, attr: OpenAttr) {
        if self.cap == 0 {
            return;
        }
        if self.files.len() >= self.cap
            && let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, kept)| kept.last_read)
                .map(|(path, _)| path.clone())
        {
            self.files.remove(&oldest);
        }
        self.clock += 1;
        let kept = KeptFile {
            attr: Arc::new(attr),
            last_read: self.clock,
        };
        self.files.insert(path.clone(), kept);
    }

    /// How many are kept now.
    pub(super) fn len(&self) -> usize {
        self.files.len()
    }

    fn forget(&mut self, path: &PathKey) {
        self.files.remove(path);
    }

    fn forget_under(&mut self, dir: &str) {
        self.files.retain(|path, _| {
            let path = path.as_str();
            !(path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
        });
    }

    fn forget_all(&mut self) {
        self.files.clear();
    }
}

/// Reads an attribute through its kept descriptor, or opens (and keeps) it.
/// A kept descriptor whose file was replaced or removed, or whose read fails
/// (a device that went away answers `ENODEV`), is dropped and the path read
/// afresh, so the answer is always what opening the path at some time
/// between the request (`queued_at`) and the answer would give. Text and
/// binary reads of a path share its descriptor.
///
/// On sysfs a file is never replaced. Elsewhere (a simulated tree, which a
/// writer updates by renaming a new file over the old one) replacements are
/// learned from an inotify watch on the file's directory ([`Replacements`]),
/// read once per batch of requests rather than checked with an `fstat` per
/// read; where no watch can be set up, each read checks the file's links.
pub(super) fn read_kept(
    inner: &Inner,
    key: &PathKey,
    op: Op,
    buf: &mut Vec<u8>,
    queued_at: Instant,
) -> Result<Answer, HostError> {
    let path = key.as_str();
    let lock = || inner.kept.lock().unwrap_or_else(|p| p.into_inner());
    let answer = |bytes: &[u8]| match op {
        Op::Bytes => Ok(Answer::Bytes(bytes.to_vec())),
        _ => inner.host.attr_str(path, bytes).map(Answer::Text),
    };
    let epoch = notice_replacements(inner, queued_at);
    let kept = lock().get(key);
    if let Some(attr) = kept {
        if let Ok(Some(len)) = attr.reread_into(buf) {
            return answer(&buf[..len]);
        }
        lock().forget(key);
    }
    inner.opened.fetch_add(1, Ordering::Relaxed);
    let (bytes, attr) = inner.host.open_attr(path)?;
    let keep = match attr {
        Some(attr) if attr.is_replaceable() => {
            match inner.replacements().watch_dir_of(&inner.host, path, epoch) {
                // Watched since before this open: nothing it missed.
                Watch::Before => Some(attr.trusting_a_watch()),
                // Watched since just after the open: kept if nothing replaced
                // the file in between (anything later is an event).
                Watch::Now if attr.still_at_its_path() => Some(attr.trusting_a_watch()),
                // Something changed meanwhile: the open may have raced a
                // replacement; the next read opens again.
                Watch::Now | Watch::Stale => None,
                Watch::Unavailable => Some(attr),
            }
        }
        other => other,
    };
    if let Some(attr) = keep {
        lock().keep(key, attr);
    }
    answer(&bytes)
}

/// Reads the queued inotify events if any read asked for after the last
/// reading of them is about to be answered, and forgets the kept files they
/// name. The epoch afterwards (see [`Replacements::epoch`]).
fn notice_replacements(inner: &Inner, queued_at: Instant) -> u64 {
    let mut replacements = inner.replacements();
    if replacements.inotify.is_none() || replacements.drained_at >= Some(queued_at) {
        return replacements.epoch;
    }
    replacements.drained_at = Some(Instant::now());
    let forget = replacements.drain();
    let epoch = replacements.epoch;
    // Forgotten before the lock is let go: another thread that finds the
    // events read must not read a kept file they name. (The kept files'
    // lock is never held while this one is taken.)
    if !forget.is_empty() {
        let mut kept = inner.kept.lock().unwrap_or_else(|p| p.into_inner());
        for what in forget {
            match what {
                Forget::File(path) => kept.forget(&PathKey::from(path.as_str())),
                Forget::Under(dir) => kept.forget_under(&dir),
                Forget::All => kept.forget_all(),
            }
        }
    }
    epoch
}

/// Whether a file's directory is watched for replacements.
enum Watch {
    /// Since before the caller's epoch.
    Before,
    /// Set up just now.
    Now,
    /// Watched, but events arrived since the caller's epoch.
    Stale,
    /// No watch: inotify or the watch could not be set up.
    Unavailable,
}

/// What inotify said to forget.
enum Forget {
    File(String),
    Under(String),
    All,
}

/// The inotify watches on the directories of kept files off sysfs.
#[derive(Default)]
pub(super) struct Replacements {
    /// Set up on first need; `None` once it failed (reads check links).
    inotify: Option<Inotify>,
    tried: bool,
    /// Directory, as the kept paths spell it → its watch (`None`: it could
    /// not be watched).
    watched: HashMap<String, Option<i32>>,
    /// Watch → the directories it stands for (two spellings of one
    /// directory share a watch).
    dirs: HashMap<i32, Vec<String>>,
    drained_at: Option<Instant>,
    /// Counts drains that found events: a file opened in one epoch is kept
    /// only if no event arrived before it is kept.
    epoch: u64,
}

/// Directories watched at most; files in others check their links.
const MAX_WATCHED_DIRS: usize = 4096;

impl Inner {
    fn replacements(&self) -> MutexGuard<'_, Replacements> {
        self.replacements.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Replacements {
    fn watch_dir_of(&mut self, host: &HostRoot, path: &str, epoch: u64) -> Watch {
        if !self.tried {
            self.tried = true;
            match Inotify::new() {
                Ok(inotify) => self.inotify = Some(inotify),
                Err(e) => tracing::debug!(
                    error = %e,
                    "cannot watch kept files for replacement; each read checks its file's links"
                ),
            }
        }
        let Some(inotify) = &self.inotify else {
            return Watch::Unavailable;
        };
        let dir = path.rfind('/').map_or("", |at| &path[..at]);
        match self.watched.get(dir) {
            Some(Some(_)) if self.epoch == epoch => return Watch::Before,
            Some(Some(_)) => return Watch::Stale,
            Some(None) => return Watch::Unavailable,
            None if self.watched.len() >= MAX_WATCHED_DIRS => return Watch::Unavailable,
            None => {}
        }
        let watched = inotify.add_watch(&host.path(dir), ENTRIES_AND_SELF).ok();
        self.watched.insert(dir.to_owned(), watched);
        match watched {
            Some(wd) => {
                self.dirs.entry(wd).or_default().push(dir.to_owned());
                Watch::Now
            }
            None => Watch::Unavailable,
        }
    }

    /// Reads the queued events: what to forget.
    fn drain(&mut self) -> Vec<Forget> {
        let Some(inotify) = self.inotify.clone() else {
            return Vec::new();
        };
        let mut forget = Vec::new();
        let mut gone: Vec<i32> = Vec::new();
        let drained = inotify.drain(|event| {
            if event.overflowed() {
                forget.push(Forget::All);
                return;
            }
            let dirs = self.dirs.get(&event.wd).map(Vec::as_slice).unwrap_or(&[]);
            // An entry deleted may be the start of the whole directory being
            // removed, and the kernel reports the directory itself deleted
            // only once nothing holds it open: another reader's kept file
            // delays that for as long as it likes, while a new directory may
            // already stand at the path. So the watch is dropped at once,
            // with the kept files it vouched for; the next open there watches
            // whatever directory is at the path then.
            if event.about_the_directory() || event.entry_deleted() {
                forget.extend(dirs.iter().map(|d| Forget::Under(d.clone())));
                gone.push(event.wd);
            } else if let Some(name) = &event.name {
                forget.extend(dirs.iter().map(|d| Forget::File(format!("{d}/{name}"))));
            }
        });
        match drained {
            Ok(false) => {}
            Ok(true) => self.epoch += 1,
            Err(e) => {
                tracing::debug!(error = %e, "inotify failed; each read checks its file's links");
                self.inotify = None;
                self.watched.clear();
                self.dirs.clear();
                self.epoch += 1;
                return vec![Forget::All];
            }
        }
        for wd in gone {
            // A moved directory keeps its watch; it no longer stands for
            // the path, so it is dropped and the path watched afresh.
            inotify.remove_watch(wd);
            for dir in self.dirs.remove(&wd).unwrap_or_default() {
                self.watched.remove(&dir);
            }
        }
        forget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::BoundedReader;
    use crate::reader::tests::{SHORT, host};

    #[tokio::test]
    async fn a_kept_descriptor_is_reread_and_follows_writes_renames_and_removal() {
        let (dir, host) = host();
        let reader = BoundedReader::new(host.clone(), 2);
        for _ in 0..5 {
            assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "1");
        }
        assert_eq!(
            reader.stats().opened,
            1,
            "read again through the kept descriptor"
        );
        assert_eq!(reader.kept(), 1);
        // Written in place (the same inode): the next read sees it.
        std::fs::write(dir.path().join("sys/a"), "22\n").unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "22");
        assert_eq!(reader.stats().opened, 1);
        // Replaced by a rename, as the simulator and atomic writers do.
        std::fs::write(dir.path().join("sys/.a.new"), "333\n").unwrap();
        std::fs::rename(dir.path().join("sys/.a.new"), dir.path().join("sys/a")).unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "333");
        assert_eq!(
            reader.stats().opened,
            2,
            "the replaced file was opened anew"
        );
        // Removed: not found, as opening the path gives, and no longer kept.
        std::fs::remove_file(dir.path().join("sys/a")).unwrap();
        let err = reader.read_attr("/sys/a", SHORT).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(reader.kept(), 0);
    }

    #[tokio::test]
    async fn a_kept_descriptor_follows_its_directory_being_replaced() {
        let (dir, host) = host();
        let reader = BoundedReader::new(host.clone(), 2);
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "1");
        assert_eq!(reader.kept(), 1);
        // The whole directory removed and written again, as `simulate`
        // does when it replaces the simulated GPUs.
        std::fs::remove_dir_all(dir.path().join("sys")).unwrap();
        host.write("/sys/a", "4\n").unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "4");
        // And once more, with the new directory watched afresh.
        std::fs::remove_dir_all(dir.path().join("sys")).unwrap();
        host.write("/sys/a", "5\n").unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "5");
        // A directory moved away and another put in its place.
        std::fs::rename(dir.path().join("sys"), dir.path().join("old")).unwrap();
        host.write("/sys/a", "6\n").unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "6");
        std::fs::write(dir.path().join("old/a"), "7\n").unwrap();
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "6");
    }

    #[tokio::test]
    async fn a_kept_descriptor_follows_its_directory_replaced_while_another_holds_it() {
        // Another reader (the health monitor's, say) keeps a file of the
        // directory open: the removed directory lives on, and the kernel
        // reports it deleted only once that file is closed. The watch on it
        // must not be trusted for the new directory at the same path.
        let (dir, host) = host();
        host.write("/sys/d/a", "1\n").unwrap();
        host.write("/sys/d/b", "b\n").unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        assert_eq!(reader.read_attr("/sys/d/a", SHORT).await.unwrap(), "1");
        let mut held = Vec::new();
        for value in ["2", "3", "4"] {
            held.push(std::fs::File::open(dir.path().join("sys/d/b")).unwrap());
            std::fs::remove_dir_all(dir.path().join("sys/d")).unwrap();
            host.write("/sys/d/a", format!("{value}\n")).unwrap();
            host.write("/sys/d/b", "b\n").unwrap();
            assert_eq!(
                reader.read_attr("/sys/d/a", SHORT).await.unwrap(),
                value,
                "the directory replaced for {value}"
            );
        }
    }

    #[tokio::test]
    async fn binary_reads_use_kept_descriptors_untrimmed_and_bounded() {
        let (dir, host) = host();
        let reader = BoundedReader::new(host.clone(), 2);
        // Not UTF-8, ends in white-space bytes, larger than a page.
        let blob: Vec<u8> = (0..5000u32)
            .map(|i| (i % 251) as u8 | 0x80)
            .chain([b' ', b'\n'])
            .collect();
        std::fs::write(dir.path().join("sys/gpu_metrics"), &blob).unwrap();
        for _ in 0..3 {
            assert_eq!(
                reader.read_bytes("/sys/gpu_metrics", SHORT).await.unwrap(),
                blob
            );
        }
        assert_eq!(
            reader.stats().opened,
            1,
            "read again through the kept descriptor"
        );
        // As text it is an error (not UTF-8), through the same descriptor.
        assert!(reader.read_attr("/sys/gpu_metrics", SHORT).await.is_err());
        // Replaced by a rename: the new bytes.
        std::fs::write(dir.path().join("sys/.new"), [1u8, 2, 3]).unwrap();
        std::fs::rename(
            dir.path().join("sys/.new"),
            dir.path().join("sys/gpu_metrics"),
        )
        .unwrap();
        assert_eq!(
            reader.read_bytes("/sys/gpu_metrics", SHORT).await.unwrap(),
            [1, 2, 3]
        );
        // At most 64 KiB, however large the file.
        std::fs::write(dir.path().join("sys/big"), vec![7u8; 200_000]).unwrap();
        let big = reader.read_bytes("/sys/big", SHORT).await.unwrap();
        assert_eq!(big.len(), 64 * 1024);
        // In a batch, beside text reads.
        let answers = reader
            .batch(
                vec![(Op::Bytes, "/sys/a".into()), (Op::Read, "/sys/b".into())],
                SHORT,
            )
            .await;
        assert!(matches!(&answers[0], Ok(Answer::Bytes(b)) if b == b"1\n"));
        assert!(matches!(&answers[1], Ok(Answer::Text(t)) if t == "2"));
    }

    #[test]
    fn kept_files_stay_within_their_cap_closing_the_least_recently_read() {
        let (dir, host) = host();
        host.write("/sys/c", "3\n").unwrap();
        let open = |path: &str| host.open_attr(path).unwrap().1.unwrap();
        let mut kept = KeptFiles::new(2);
        kept.keep(&"/sys/a".into(), open("/sys/a"));
        kept.keep(&"/sys/b".into(), open("/sys/b"));
        assert!(kept.get(&"/sys/a".into()).is_some());
        kept.keep(&"/sys/c".into(), open("/sys/c"));
        let mut paths: Vec<&str> = kept.files.keys().map(PathKey::as_str).collect();
        paths.sort();
        assert_eq!(paths, ["/sys/a", "/sys/c"], "b was read least recently");
        let mut none = KeptFiles::new(0);
        none.keep(&"/sys/a".into(), open("/sys/a"));
        assert!(none.files.is_empty(), "a cap of zero keeps nothing");
        drop(dir);
    }
}
