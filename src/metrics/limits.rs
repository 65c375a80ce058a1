//! File-descriptor budget of the process, and how much of it the metrics
//! endpoint may spend on connections.
//!
//! Owns: raising `RLIMIT_NOFILE` to its hard limit at process start (as servers
//! do), and the rule that caps the endpoint's concurrent connections at a
//! fraction of the soft limit, so that idle or hostile clients can never take
//! the descriptors that discovery, sysfs reads, kubelet sockets and API
//! connections need.
//!
//! Must not: lower any limit, or decide anything else about connections (the
//! server in [`super::server`] enforces the cap).

use std::io;

/// At most this fraction (1/N) of the soft descriptor limit goes to metrics
/// connections; the rest is the reserve for GPU work and the API.
pub const CONNECTION_SHARE_DIVISOR: u64 = 4;

/// The limit used when the hard limit is "unlimited": Linux refuses a soft
/// `RLIMIT_NOFILE` above `fs.nr_open` (1 Mi by default).
const UNLIMITED_TARGET: u64 = 1 << 20;

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

/// How many connections the endpoint may hold: the configured number, but at
/// most a quarter of the soft descriptor limit, and at least one.
pub fn connection_cap(configured: usize, soft_limit: u64) -> usize {
    let share = usize::try_from(soft_limit / CONNECTION_SHARE_DIVISOR).unwrap_or(usize::MAX);
    configured.min(share).max(1)
}

/// [`connection_cap`] against this process's current soft limit (the
/// configured number alone when the limit cannot be read).
pub fn current_connection_cap(configured: usize) -> usize {
    match nofile_limits() {
        Ok((soft, _)) => connection_cap(configured, soft),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE; using the configured connection cap");
            configured.max(1)
        }
    }
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
    fn the_cap_keeps_three_quarters_of_the_descriptors_in_reserve() {
        assert_eq!(connection_cap(128, 1 << 20), 128);
        assert_eq!(connection_cap(128, 256), 64);
        assert_eq!(connection_cap(128, 2), 1, "never zero");
        assert_eq!(connection_cap(0, 1024), 1);
    }
}
