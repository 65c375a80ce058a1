//! The process's file-descriptor budget: reading `RLIMIT_NOFILE`, raising the
//! soft limit to the hard one at process start (as servers do), and how many
//! descriptors one [`super::reader::BoundedReader`] may keep open between
//! reads.
//!
//! Must not: lower any limit, or spend descriptors itself. The other shares
//! (the metrics endpoint's connection cap) are decided by their owners from
//! [`nofile_limits`].

use std::io;

/// The soft and hard `RLIMIT_NOFILE` of this process.
pub fn nofile_limits() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the valid, exclusively
    // borrowed `limit` and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// The limit used when the hard limit is "unlimited": Linux refuses a soft
/// `RLIMIT_NOFILE` above `fs.nr_open` (1 Mi by default).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// The soft limit to ask for given the current soft and hard limits: the hard
/// limit (bounded when unlimited), never less than the current soft limit.
pub fn raised_soft_limit(soft: u64, hard: u64) -> u64 {
    let target = if hard == libc::RLIM_INFINITY {
        UNLIMITED_TARGET
    } else {
        hard
    };
    target.max(soft)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. Returns the soft limit
/// before and after. Call once, at process start.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = nofile_limits()?;
    let target = raised_soft_limit(soft, hard);
    if target == soft {
        return Ok((soft, soft));
    }
    let limit = libc::rlimit {
        rlim_cur: target,
        rlim_max: hard,
    };
    // SAFETY: `setrlimit` only reads the valid `limit`; raising the soft limit
    // up to the hard one is always allowed and affects no memory of ours.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((soft, target))
}

/// At most this fraction (1/N) of the soft limit is kept open by one reader.
/// A process has a handful of readers (discovery, health, the exporter), and
/// the metrics endpoint may take a quarter for connections; the rest stays
/// free for sockets, the API and one-off reads.
pub const KEPT_SHARE_DIVISOR: u64 = 16;

/// And never more than this many per reader: enough for every attribute the
/// exporter samples on a full node (MI300X in CPX/NPS4: 8 GPUs and 64
/// partitions, about 600 files each sample), far below what any soft limit
/// allows. A reader whose working set is larger than its cap keeps almost
/// nothing useful: its files are read in the same order each sample, so the
/// least recently read one, which is closed to make room, is always the next
/// one wanted. At 256 the exporter so opened every file afresh each sample.
pub const MAX_KEPT_PER_READER: usize = 1024;

/// How many attribute descriptors one reader may keep open at `soft_limit`.
pub fn kept_descriptor_cap(soft_limit: u64) -> usize {
    usize::try_from(soft_limit / KEPT_SHARE_DIVISOR)
        .unwrap_or(usize::MAX)
        .min(MAX_KEPT_PER_READER)
}

/// [`kept_descriptor_cap`] at this process's current soft limit; none kept
/// when the limit cannot be read.
pub fn current_kept_descriptor_cap() -> usize {
    nofile_limits().map_or(0, |(soft, _)| kept_descriptor_cap(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_never_lowered() {
        assert_eq!(raised_soft_limit(1024, 524_288), 524_288);
        assert_eq!(raised_soft_limit(256, 256), 256);
        assert_eq!(
            raised_soft_limit(1024, libc::RLIM_INFINITY),
            UNLIMITED_TARGET
        );
        assert_eq!(raised_soft_limit(2 << 20, libc::RLIM_INFINITY), 2 << 20);
    }

    #[test]
    fn raising_leaves_soft_equal_to_hard() {
        // Raising the soft limit to the hard one is what every server does at
        // start; doing it in the test process harms nothing.
        let (_, after) = raise_nofile_limit().unwrap();
        let (soft, hard) = nofile_limits().unwrap();
        assert_eq!(soft, after);
        assert_eq!(soft, raised_soft_limit(soft, hard));
    }

    #[test]
    fn readers_keep_a_sixteenth_of_the_limit_at_most_1024() {
        assert_eq!(kept_descriptor_cap(1 << 20), 1024);
        assert_eq!(kept_descriptor_cap(8192), 512);
        assert_eq!(kept_descriptor_cap(1024), 64);
        assert_eq!(kept_descriptor_cap(256), 16);
        assert_eq!(kept_descriptor_cap(8), 0);
    }
}
