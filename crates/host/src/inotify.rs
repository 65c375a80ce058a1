//! A thin, safe wrapper of one Linux inotify instance: set up watches, and
//! read the queued events without ever blocking.
//!
//! Four readers of the host use it: the health monitor's and the device
//! plugin's device-node checks ([`DevWatch`]: entries of `/dev` and
//! `/dev/dri` created or removed), the device plugin's watch of the kubelet's
//! directory ([`DirWatch`]: `kubelet.sock` replaced, a plugin socket removed)
//! and the bounded reader, which learns from it that a kept descriptor's file
//! was replaced off sysfs. [`Readiness`] lets an async task sleep until
//! events are queued instead of looking on a timer. This module owns the
//! descriptor and the event format; what an event means belongs to its users.
//! Setting up a watch resolves a path, which can block on a broken mount:
//! callers run it where blocking is bounded.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Entries created, removed or renamed in a directory, and the directory
/// itself removed or moved.
pub const ENTRIES_AND_SELF: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

/// One inotify instance. Clones share it.
#[derive(Clone, Debug)]
pub struct Inotify {
    fd: Arc<OwnedFd>,
}

/// One event as the kernel queued it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The watch it concerns; `-1` for a queue overflow.
    pub wd: i32,
    pub mask: u32,
    /// The entry's name, for events about an entry of a watched directory.
    pub name: Option<String>,
}

impl Event {
    /// Events were lost: everything watched may have changed.
    pub fn overflowed(&self) -> bool {
        self.mask & libc::IN_Q_OVERFLOW != 0
    }

    /// The watch is gone (its directory was removed or unmounted).
    pub fn watch_removed(&self) -> bool {
        self.mask & libc::IN_IGNORED != 0
    }

    /// The watched directory itself was removed or moved.
    pub fn about_the_directory(&self) -> bool {
        self.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0
    }

    /// An entry of the watched directory was deleted (not replaced by a
    /// rename, which is `IN_MOVED_TO`).
    pub fn entry_deleted(&self) -> bool {
        self.mask & libc::IN_DELETE != 0
    }
}

impl Inotify {
    /// A new, non-blocking instance.
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: no pointers; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd: Arc::new(fd) })
    }

    /// Watches `path` for `mask`; the watch descriptor. Watching a path that
    /// is already watched returns its existing descriptor.
    pub fn add_watch(&self, path: &Path, mask: u32) -> std::io::Result<i32> {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: `c_path` is NUL-terminated and outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c_path.as_ptr(), mask) };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Stops a watch (the kernel then queues its `IN_IGNORED`).
    pub fn remove_watch(&self, wd: i32) {
        // SAFETY: no pointers; a stale `wd` only makes the call fail.
        unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
    }

    /// Hands every queued event to `each`, without blocking. True if any
    /// was queued.
    pub fn drain(&self, mut each: impl FnMut(Event)) -> std::io::Result<bool> {
        let mut any = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(any),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if n == 0 {
                return Ok(any);
            }
            for event in parse_events(&buf[..n as usize]) {
                any = true;
                each(event);
            }
        }
    }
}

impl AsRawFd for Inotify {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Wakes an async task when an inotify instance has events queued, through
/// the tokio runtime's reactor: the task sleeps until something happened
/// instead of looking every few hundred milliseconds.
#[derive(Debug)]
pub struct Readiness {
    fd: tokio::io::unix::AsyncFd<Inotify>,
}

impl Readiness {
    /// Registers `inotify` with the current runtime's reactor. An error
    /// outside a tokio runtime (where registering would panic), or when the
    /// reactor refuses it; one instance can have one `Readiness` at a time.
    pub fn new(inotify: &Inotify) -> std::io::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(std::io::Error::other("no tokio runtime to wait in"));
        }
        // SAFETY: the clone owns a reference to the instance's `OwnedFd`,
        // so the descriptor stays open, the same file description, for as
        // long as the `AsyncFd` holds it, and `as_raw_fd` always returns it.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                inotify.clone(),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    /// Returns once events are queued; the caller then drains them. The
    /// readiness is cleared before the caller drains, so an event queued
    /// while it drains wakes the next wait (at worst once for nothing)
    /// instead of being slept through. Cancel-safe. An error only when the
    /// runtime's reactor is gone.
    pub async fn queued(&self) -> std::io::Result<()> {
        let mut guard = self.fd.readable().await?;
        guard.clear_ready();
        Ok(())
    }

    /// [`Readiness::queued`] of a watch that may be missing: never returns
    /// without one, or once the reactor is gone, so that a task can wait
    /// on it beside its other wake-ups whether or not it has a watch.
    pub async fn queued_or_never(ready: Option<&Self>) {
        match ready {
            Some(ready) if ready.queued().await.is_ok() => {}
            _ => std::future::pending().await,
        }
    }
}

/// An inotify instance watching one directory for entries created, removed
/// or renamed, and for the directory itself going away.
#[derive(Debug)]
pub struct DirWatch {
    inotify: Inotify,
    wd: i32,
}

impl DirWatch {
    /// Watches `dir`, which must exist. Resolves the path, so it can block on
    /// a broken mount.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        let inotify = Inotify::new()?;
        let wd = inotify.add_watch(dir, ENTRIES_AND_SELF)?;
        Ok(Self { inotify, wd })
    }

    /// The instance, for [`Readiness`].
    pub fn inotify(&self) -> &Inotify {
        &self.inotify
    }

    /// Reads every pending event. True if any arrived. An error once the
    /// watch is gone (the directory was removed or moved: a new one at the
    /// same path needs a new watch), or the descriptor fails.
    pub fn drain(&mut self) -> std::io::Result<bool> {
        let (wd, mut gone) = (self.wd, false);
        let changed = self.inotify.drain(|event| {
            gone |= event.wd == wd && event.about_the_directory();
        })?;
        if gone {
            return Err(std::io::Error::other("the directory's watch was removed"));
        }
        Ok(changed)
    }
}

/// An inotify instance watching a devfs directory (`/dev`) and its DRM
/// subdirectory (`/dev/dri`) for entries created, removed or renamed, and for
/// the directories themselves going away: what tells a device-node check
/// that its last answer may be stale.
#[derive(Debug)]
pub struct DevWatch {
    inotify: Inotify,
    dev: i32,
    dri_path: PathBuf,
    /// `None` while the subdirectory does not exist (or its watch was removed).
    dri: Option<i32>,
}

/// Setting up a [`DevWatch`]'s subdirectory watch again, detached from the
/// watch so that it can run where blocking is bounded.
#[derive(Debug)]
pub struct DriRewatch {
    inotify: Inotify,
    path: PathBuf,
}

impl DriRewatch {
    /// Resolves the path, so it can block on a broken mount. The new watch
    /// descriptor, for [`DevWatch::dri_watched`].
    pub fn run(self) -> std::io::Result<i32> {
        self.inotify.add_watch(&self.path, ENTRIES_AND_SELF)
    }
}

impl DevWatch {
    /// Watches `dev` (which must exist) and `dri` (which may not yet). Resolves
    /// both paths, so it can block on a broken mount.
    pub fn open(dev: &Path, dri: &Path) -> std::io::Result<Self> {
        let inotify = Inotify::new()?;
        let dev = inotify.add_watch(dev, ENTRIES_AND_SELF)?;
        let dri_path = dri.to_path_buf();
        let dri = inotify.add_watch(dri, ENTRIES_AND_SELF).ok();
        Ok(Self {
            inotify,
            dev,
            dri_path,
            dri,
        })
    }

    /// The instance, for [`Readiness`].
    pub fn inotify(&self) -> &Inotify {
        &self.inotify
    }

    /// Whether the subdirectory is watched now.
    pub fn watching_dri(&self) -> bool {
        self.dri.is_some()
    }

    /// What sets the subdirectory's watch up again (after it was removed and
    /// made again); hand its result to [`DevWatch::dri_watched`].
    pub fn dri_rewatch(&self) -> DriRewatch {
        DriRewatch {
            inotify: self.inotify.clone(),
            path: self.dri_path.clone(),
        }
    }

    /// Records the subdirectory's new watch.
    pub fn dri_watched(&mut self, wd: i32) {
        self.dri = Some(wd);
    }

    /// Reads every pending event. True if any arrived. An error when the
    /// watch on the devfs directory itself is gone, or the descriptor fails.
    pub fn drain(&mut self) -> std::io::Result<bool> {
        let mut dev_gone = false;
        let (dev, dri) = (self.dev, &mut self.dri);
        let changed = self.inotify.drain(|event| {
            if event.watch_removed() {
                dev_gone |= event.wd == dev;
                if Some(event.wd) == *dri {
                    *dri = None;
                }
            }
        })?;
        if dev_gone {
            return Err(std::io::Error::other("the watch on /dev was removed"));
        }
        Ok(changed)
    }
}

/// The `struct inotify_event`s in `buf`. Pure; a truncated tail is ignored.
pub fn parse_events(buf: &[u8]) -> Vec<Event> {
    const HEADER: usize = 16;
    let word = |at: usize| -> Option<[u8; 4]> { buf.get(at..at + 4)?.try_into().ok() };
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER <= buf.len() {
        let (Some(wd), Some(mask), Some(len)) = (word(at), word(at + 4), word(at + 12)) else {
            break;
        };
        let len = u32::from_ne_bytes(len) as usize;
        let name = buf
            .get(at + HEADER..at + HEADER + len)
            .map(|raw| {
                // The name is NUL-padded to an alignment boundary.
                let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
                String::from_utf8_lossy(&raw[..end]).into_owned()
            })
            .filter(|n| !n.is_empty());
        out.push(Event {
            wd: i32::from_ne_bytes(wd),
            mask: u32::from_ne_bytes(mask),
            name,
        });
        at += HEADER + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(wd: i32, mask: u32, name: &str) -> Vec<u8> {
        let mut padded = name.as_bytes().to_vec();
        if !padded.is_empty() {
            padded.resize(name.len().div_ceil(16) * 16 + 16, 0);
        }
        let mut out = Vec::new();
        out.extend(wd.to_ne_bytes());
        out.extend(mask.to_ne_bytes());
        out.extend(0u32.to_ne_bytes());
        out.extend((padded.len() as u32).to_ne_bytes());
        out.extend(padded);
        out
    }

    #[test]
    fn events_are_parsed_with_their_names_and_a_truncated_tail_is_dropped() {
        let mut buf = raw(3, libc::IN_MOVED_TO, "gpu_busy_percent");
        buf.extend(raw(-1, libc::IN_Q_OVERFLOW, ""));
        buf.extend(raw(4, libc::IN_IGNORED, ""));
        buf.extend(&raw(5, libc::IN_CREATE, "x")[..10]);
        let events = parse_events(&buf);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0].name.as_deref(), Some("gpu_busy_percent"));
        assert!(!events[0].about_the_directory());
        assert!(events[1].overflowed() && events[1].name.is_none());
        assert!(events[2].watch_removed() && events[2].about_the_directory());
    }

    #[test]
    fn a_rename_into_a_watched_directory_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let inotify = Inotify::new().unwrap();
        let wd = inotify.add_watch(dir.path(), ENTRIES_AND_SELF).unwrap();
        assert!(!inotify.drain(|_| {}).unwrap(), "nothing happened yet");
        std::fs::write(dir.path().join("tmp"), "1").unwrap();
        std::fs::rename(dir.path().join("tmp"), dir.path().join("value")).unwrap();
        let mut seen = Vec::new();
        assert!(inotify.drain(|e| seen.push(e)).unwrap());
        assert!(
            seen.iter().any(|e| e.wd == wd
                && e.mask & libc::IN_MOVED_TO != 0
                && e.name.as_deref() == Some("value")),
            "{seen:?}"
        );
    }

    #[test]
    fn a_directory_watch_reports_entries_and_fails_once_the_directory_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let watched = dir.path().join("plugins");
        std::fs::create_dir(&watched).unwrap();
        let mut watch = DirWatch::open(&watched).unwrap();
        assert!(!watch.drain().unwrap(), "nothing happened yet");
        std::fs::write(watched.join("kubelet.sock"), "").unwrap();
        assert!(watch.drain().unwrap());
        assert!(!watch.drain().unwrap(), "drained");
        std::fs::remove_dir_all(&watched).unwrap();
        assert!(watch.drain().is_err(), "the watch went with its directory");
        assert!(DirWatch::open(&watched).is_err(), "nothing to watch");
    }

    #[tokio::test]
    async fn readiness_wakes_a_task_for_events_queued_before_and_after_it_waits() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = DirWatch::open(dir.path()).unwrap();
        let ready = Readiness::new(watch.inotify()).unwrap();
        let bound = std::time::Duration::from_secs(10);
        // Queued before the first wait.
        std::fs::write(dir.path().join("a"), "").unwrap();
        tokio::time::timeout(bound, ready.queued())
            .await
            .expect("woken for an event queued before")
            .unwrap();
        assert!(watch.drain().unwrap());
        // Nothing queued: the wait does not return.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), ready.queued())
                .await
                .is_err(),
            "no event, no wake-up"
        );
        // Queued while it waits.
        let path = dir.path().join("b");
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            std::fs::write(path, "").unwrap();
        });
        tokio::time::timeout(bound, ready.queued())
            .await
            .expect("woken for an event queued while waiting")
            .unwrap();
        writer.await.unwrap();
        assert!(watch.drain().unwrap());
    }

    #[test]
    fn readiness_needs_a_runtime_and_says_so() {
        let inotify = Inotify::new().unwrap();
        assert!(Readiness::new(&inotify).is_err());
    }
}
