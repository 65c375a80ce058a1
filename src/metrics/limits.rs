//! File-descriptor budget of the process, and how much of it the metrics
//! endpoint may spend on connections.
//!
//! Owns: the rule that caps the endpoint's concurrent connections at a
//! fraction of the soft limit, so that idle or hostile clients can never take
//! the descriptors that discovery, sysfs reads, kubelet sockets and API
//! connections need. The limit itself (reading and raising it) belongs to
//! [`crate::host::descriptors`].
//!
//! Must not: lower any limit, or decide anything else about connections (the
//! server in [`super::server`] enforces the cap).

use crate::host::descriptors::nofile_limits;

/// At most this fraction (1/N) of the soft descriptor limit goes to metrics
/// connections; the rest is the reserve for GPU work and the API.
pub const CONNECTION_SHARE_DIVISOR: u64 = 4;

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
    fn the_cap_keeps_three_quarters_of_the_descriptors_in_reserve() {
        assert_eq!(connection_cap(128, 1 << 20), 128);
        assert_eq!(connection_cap(128, 256), 64);
        assert_eq!(connection_cap(128, 2), 1, "never zero");
        assert_eq!(connection_cap(0, 1024), 1);
    }
}
