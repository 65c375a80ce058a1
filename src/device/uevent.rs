//! Kernel uevents, straight from the kernel's netlink socket
//! (`NETLINK_KOBJECT_UEVENT`, multicast group 1), without udevd.
//!
//! The kernel broadcasts one message per device change (`add`, `remove`,
//! `change`, `bind`, `unbind`...). A pod with `hostNetwork` and the host's `/sys`
//! sees the same messages as the host. They are only hints for the watch: any
//! event of the subsystems discovery reads (`drm`, `pci`, `kfd`) makes it run a
//! full discovery at once instead of waiting for the next cheap tick.
//!
//! This module owns the choice of event source ([`choose`], a pure function),
//! the parsing of uevent messages ([`parse`], pure) and the socket. It must not
//! read sysfs or decide what a change means.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Where change hints come from besides the watch's own cheap tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintSource {
    /// The libudev monitor (the `udev` feature, udevd running on this host).
    Udev,
    /// The kernel's uevent netlink socket.
    Netlink,
    /// No event source: the tick alone notices changes.
    TickOnly,
}

/// What [`choose`] decides from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The caller wants kernel events at all (`WatchConfig::use_udev`).
    pub wanted: bool,
    /// Built with the `udev` feature.
    pub udev_compiled: bool,
    /// The host root is `/`: libudev talks to this machine's udevd.
    pub root_is_slash: bool,
    /// `/run/udev` exists under the host root (udevd is running).
    pub run_udev: bool,
    /// The host root's `/sys` is a real sysfs mount: `/` on a host, or the
    /// host's `/sys` mounted into a pod. False for simulated trees.
    pub sys_is_sysfs: bool,
}

/// Picks the event source. udevd's monitor is preferred where it is reachable
/// (its events come after device nodes exist); otherwise the kernel's own
/// socket, which needs only a real sysfs to be worth listening to. A simulated
/// host (a plain directory) gets neither: no kernel event is about it.
pub fn choose(facts: HostFacts) -> HintSource {
    if !facts.wanted {
        HintSource::TickOnly
    } else if facts.udev_compiled && facts.root_is_slash && facts.run_udev {
        HintSource::Udev
    } else if facts.sys_is_sysfs {
        HintSource::Netlink
    } else {
        HintSource::TickOnly
    }
}

/// The parts of a uevent message the watch looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uevent<'a> {
    pub action: &'a str,
    pub devpath: &'a str,
    pub subsystem: Option<&'a str>,
}

impl Uevent<'_> {
    /// Events of the subsystems discovery reads.
    pub fn concerns_gpus(&self) -> bool {
        matches!(self.subsystem, Some("drm" | "pci" | "kfd"))
    }
}

/// Parses one kernel uevent message: `ACTION@DEVPATH\0KEY=VALUE\0...`.
/// `None` for what is not one: udevd's re-broadcasts (they start with the
/// `libudev` magic header and carry a binary header), empty or malformed
/// messages. `ACTION`, `DEVPATH` and `SUBSYSTEM` keys win over the header line.
pub fn parse(message: &[u8]) -> Option<Uevent<'_>> {
    if message.starts_with(b"libudev\0") {
        return None;
    }
    let mut fields = message
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(std::str::from_utf8);
    let header = fields.next()?.ok()?;
    let (action, devpath) = header.split_once('@')?;
    if action.is_empty() || !devpath.starts_with('/') {
        return None;
    }
    let mut event = Uevent {
        action,
        devpath,
        subsystem: None,
    };
    // A field that is not UTF-8 is skipped: none of the keys read here can be.
    for field in fields.flatten() {
        match field.split_once('=') {
            Some(("ACTION", value)) => event.action = value,
            Some(("DEVPATH", value)) => event.devpath = value,
            Some(("SUBSYSTEM", value)) => event.subsystem = Some(value),
            _ => {}
        }
    }
    Some(event)
}

/// The kernel's multicast group for uevents (group 2 is udevd's).
const KERNEL_GROUP: u32 = 1;
const RECV_BUFFER: usize = 8192;

/// A non-blocking uevent netlink socket registered with the tokio reactor.
/// Dropping it closes the socket.
pub struct UeventSocket {
    fd: AsyncFd<OwnedFd>,
    buffer: Box<[u8; RECV_BUFFER]>,
}

impl UeventSocket {
    /// Opens and binds the socket. Must be called inside a tokio runtime.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain system call with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_KOBJECT_UEVENT,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = KERNEL_GROUP;
        // SAFETY: `address` is a valid sockaddr_nl and the length is its size.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const address).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `OwnedFd` keeps the descriptor open, and it always returns
        // the same one, until the `AsyncFd` that owns it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self {
            fd,
            buffer: Box::new([0; RECV_BUFFER]),
        })
    }

    /// Waits until at least one message that [`Uevent::concerns_gpus`] arrived,
    /// then drains what is queued. Lost messages (the receive buffer overflowed)
    /// count as relevant: what they said is unknown. An `Err` is fatal for the
    /// socket.
    pub async fn next_gpu_event(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut relevant = false;
            loop {
                match recv_from_kernel(guard.get_inner().as_raw_fd(), &mut self.buffer[..]) {
                    Ok(Some(len)) => {
                        if let Some(event) = parse(&self.buffer[..len]) {
                            tracing::debug!(
                                action = event.action,
                                devpath = event.devpath,
                                subsystem = event.subsystem,
                                "uevent"
                            );
                            relevant |= event.concerns_gpus();
                        }
                    }
                    // From a process, not the kernel: not a uevent.
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => relevant = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if relevant {
                return Ok(());
            }
        }
    }
}

/// One `recvfrom`: `Some(length)` for a message the kernel sent (netlink port
/// 0), `None` for one from a process.
fn recv_from_kernel(fd: i32, buffer: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
    let mut sender: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    let mut sender_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    // SAFETY: `buffer` is valid for writes of its length, `sender` for its size,
    // and `sender_len` holds that size.
    let received = unsafe {
        libc::recvfrom(
            fd,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            0,
            (&raw mut sender).cast::<libc::sockaddr>(),
            &mut sender_len,
        )
    };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((sender.nl_pid == 0).then_some(received as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::is_sysfs;

    #[test]
    fn kernel_messages_parse_and_keys_win_over_the_header() {
        let message = b"change@/devices/pci0000:00/0000:05:00.0/drm/card0\0\
            ACTION=change\0DEVPATH=/devices/pci0000:00/0000:05:00.0/drm/card0\0\
            SUBSYSTEM=drm\0HOTPLUG=1\0SEQNUM=4711\0";
        let event = parse(message).unwrap();
        assert_eq!(
            event,
            Uevent {
                action: "change",
                devpath: "/devices/pci0000:00/0000:05:00.0/drm/card0",
                subsystem: Some("drm"),
            }
        );
        assert!(event.concerns_gpus());

        let event = parse(b"add@/devices/x\0ACTION=remove\0SUBSYSTEM=pci").unwrap();
        assert_eq!(event.action, "remove", "the ACTION key wins");
        assert!(event.concerns_gpus());
    }

    #[test]
    fn other_subsystems_do_not_concern_gpus() {
        for subsystem in ["usb", "net", "block", "drm_dp_aux_dev"] {
            let message = format!("add@/devices/y\0SUBSYSTEM={subsystem}\0");
            let event = parse(message.as_bytes()).unwrap();
            assert!(!event.concerns_gpus(), "{subsystem}");
        }
        let event = parse(b"add@/devices/y\0SEQNUM=1\0").unwrap();
        assert_eq!(event.subsystem, None);
        assert!(!event.concerns_gpus());
        let kfd = parse(b"add@/devices/virtual/kfd/kfd\0SUBSYSTEM=kfd\0").unwrap();
        assert!(kfd.concerns_gpus());
    }

    #[test]
    fn libudev_rebroadcasts_and_garbage_are_not_uevents() {
        let mut udev = b"libudev\0".to_vec();
        udev.extend_from_slice(&0xfeedcafe_u32.to_be_bytes());
        udev.extend_from_slice(&[0, 0, 0, 40, 0, 0, 0, 40]);
        udev.extend_from_slice(b"ACTION=add\0DEVPATH=/devices/z\0SUBSYSTEM=drm\0");
        assert_eq!(parse(&udev), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"\0\0"), None);
        assert_eq!(parse(b"no header here\0SUBSYSTEM=drm"), None);
        assert_eq!(parse(b"@/devices/x\0SUBSYSTEM=drm"), None);
        assert_eq!(parse(b"add@relative\0SUBSYSTEM=drm"), None);
        assert_eq!(parse(&[0xff, 0xfe, b'@', b'/']), None);
        // A field that is not UTF-8 costs that field only.
        let event = parse(b"add@/devices/x\0BAD=\xff\0SUBSYSTEM=pci\0").unwrap();
        assert_eq!(event.subsystem, Some("pci"));
    }

    #[test]
    fn the_event_source_follows_the_host() {
        let real_host = HostFacts {
            wanted: true,
            udev_compiled: true,
            root_is_slash: true,
            run_udev: true,
            sys_is_sysfs: true,
        };
        assert_eq!(choose(real_host), HintSource::Udev);
        assert_eq!(
            choose(HostFacts {
                wanted: false,
                ..real_host
            }),
            HintSource::TickOnly
        );
        // No udevd, or built without the feature: the kernel's own socket.
        for facts in [
            HostFacts {
                run_udev: false,
                ..real_host
            },
            HostFacts {
                udev_compiled: false,
                ..real_host
            },
        ] {
            assert_eq!(choose(facts), HintSource::Netlink, "{facts:?}");
        }
        // A pod: the host's /sys under /host, udev not reachable through libudev.
        let pod = HostFacts {
            root_is_slash: false,
            ..real_host
        };
        assert_eq!(choose(pod), HintSource::Netlink);
        // A simulated host in a temporary directory.
        let simulated = HostFacts {
            wanted: true,
            udev_compiled: true,
            ..HostFacts::default()
        };
        assert_eq!(choose(simulated), HintSource::TickOnly);
        assert_eq!(
            choose(HostFacts {
                run_udev: true,
                ..simulated
            }),
            HintSource::TickOnly
        );
    }

    #[test]
    fn a_temporary_directory_is_not_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_sysfs(dir.path()));
        assert!(!is_sysfs(&dir.path().join("missing")));
    }
}
