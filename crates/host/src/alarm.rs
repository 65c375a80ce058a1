//! Timers that wake the process once, at deadlines every periodic task shares.
//!
//! tokio's timer wheel keeps a deadline more than 64 ms away in a coarser
//! level, and wakes its thread at the start of the 64 ms slot holding it (to
//! move it to the finest level), then again at the deadline: two wake-ups of
//! the runtime for each periodic sample, and on an idle node a wake-up is
//! most of what a sample costs (`AGENT_BENCH=idle cargo bench --bench agent`).
//! An [`Alarm`] is a Linux timerfd armed at an absolute `CLOCK_MONOTONIC`
//! time and waited for through the runtime's reactor: the runtime wakes
//! once, when it fires. Without a timerfd (it cannot be created or armed)
//! an alarm falls back to tokio's timer.
//!
//! [`next_on_grid`] puts periodic deadlines on whole multiples of their
//! period on that clock, the same for every task of the process: tasks whose
//! periods divide one another (the device plugin's 200 ms, health's 500 ms,
//! discovery's 1 s, the exporter's 5 s) fire at the same instants, and one
//! wake-up serves them all.
//!
//! This module owns the timer descriptors and the grid; it must not know what
//! any task does at its deadlines.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The first point of the grid of `period` strictly after `now`: a whole
/// multiple of `period` on the monotonic clock, the same grid for every
/// caller in the process. Pure but for the process-wide clock anchor.
pub fn next_on_grid(now: Instant, period: Duration) -> Instant {
    let period = period.as_nanos().max(1);
    let at = monotonic_nanos(now);
    from_monotonic_nanos((at / period + 1) * period)
}

/// Nanoseconds of `CLOCK_MONOTONIC` at `instant`. `Instant` on Linux is that
/// clock, but does not say its value; one reading of both, taken once for the
/// process, maps each to the other, so that one instant always maps to the
/// same value (alarms armed for one instant by different tasks fire together).
/// The clock is read after the `Instant`, so a value is never below the
/// clock's at that instant: an alarm never fires before its deadline.
fn monotonic_nanos(instant: Instant) -> u128 {
    let (anchor, anchor_nanos) = anchor();
    match instant.checked_duration_since(anchor) {
        Some(after) => anchor_nanos + after.as_nanos(),
        None => anchor_nanos.saturating_sub(anchor.duration_since(instant).as_nanos()),
    }
}

fn from_monotonic_nanos(nanos: u128) -> Instant {
    let (anchor, anchor_nanos) = anchor();
    let offset = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
    if nanos >= anchor_nanos {
        anchor + offset(nanos - anchor_nanos)
    } else {
        anchor
            .checked_sub(offset(anchor_nanos - nanos))
            .unwrap_or(anchor)
    }
}

fn anchor() -> (Instant, u128) {
    static ANCHOR: OnceLock<(Instant, u128)> = OnceLock::new();
    *ANCHOR.get_or_init(|| {
        let instant = Instant::now();
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let nanos = u128::try_from(now.tv_sec).unwrap_or(0) * NANOS_PER_SEC
            + u128::try_from(now.tv_nsec).unwrap_or(0);
        (instant, nanos)
    })
}

/// A timer that wakes the runtime once, at its deadline (see the module
/// doc). Waiting is cancel-safe: a wait dropped and begun again for the same
/// deadline neither re-arms the timer nor misses it.
#[derive(Debug)]
pub struct Alarm {
    /// `None` when no timerfd could be made: tokio's timer then.
    fd: Option<AsyncFd<OwnedFd>>,
    /// The deadline the timerfd is armed for, until it is seen to fire.
    armed: Option<Instant>,
}

impl Alarm {
    /// A new alarm. Must be called inside a tokio runtime with I/O enabled.
    pub fn new() -> Self {
        let fd = match timerfd() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::debug!(error = %e, "no timerfd; tokio's timer instead");
                None
            }
        };
        Self { fd, armed: None }
    }

    /// Returns at `deadline` (at once if it has passed).
    pub async fn sleep_until(&mut self, deadline: Instant) {
        if deadline <= Instant::now() {
            self.armed = None;
            return;
        }
        if self.armed != Some(deadline) {
            self.armed = None;
            if let Some(fd) = &self.fd {
                match arm(fd.get_ref(), deadline) {
                    Ok(()) => self.armed = Some(deadline),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot arm a timerfd; tokio's timer instead");
                        self.fd = None;
                    }
                }
            }
        }
        let Some(fd) = &self.fd else {
            return tokio::time::sleep_until(deadline).await;
        };
        loop {
            let Ok(mut ready) = fd.readable().await else {
                break;
            };
            // Expirations of an earlier arming were discarded when it was
            // re-armed: a read that finds one means this deadline came.
            match ready.try_io(|fd| read_expirations(fd.get_ref())) {
                Ok(Ok(())) => {
                    self.armed = None;
                    return;
                }
                Ok(Err(_)) => break,
                // Not fired yet (the readiness was an earlier arming's).
                Err(_would_block) => continue,
            }
        }
        // The descriptor failed: tokio's timer from now on.
        self.fd = None;
        self.armed = None;
        tokio::time::sleep_until(deadline).await
    }
}

impl Default for Alarm {
    fn default() -> Self {
        Self::new()
    }
}

/// Ticks on the process's grid of a period (see [`next_on_grid`]), waiting
/// on an [`Alarm`]. The first tick is the next point of the grid; a late
/// tick is followed by the next point after it, not by a burst of catch-up
/// ticks. [`Ticker::tick`] is cancel-safe.
#[derive(Debug)]
pub struct Ticker {
    alarm: Alarm,
    period: Duration,
    next: Instant,
}

impl Ticker {
    /// Must be called inside a tokio runtime.
    pub fn new(period: Duration) -> Self {
        Self {
            alarm: Alarm::new(),
            period,
            next: next_on_grid(Instant::now(), period),
        }
    }

    /// As [`Ticker::new`], but the first tick is at once; the next ones
    /// fall on the grid.
    pub fn starting_now(period: Duration) -> Self {
        Self {
            alarm: Alarm::new(),
            period,
            next: Instant::now(),
        }
    }

    /// Waits for the next tick, and returns its point of the grid.
    pub async fn tick(&mut self) -> Instant {
        self.alarm.sleep_until(self.next).await;
        let point = self.next;
        self.next = next_on_grid(Instant::now().max(point), self.period);
        point
    }
}

fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
    // Registering with the reactor outside a runtime would panic.
    tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    // SAFETY: no pointers; the result is checked.
    let raw = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `OwnedFd` keeps the descriptor open, and it always returns
    // the same one, until the `AsyncFd` that owns it is dropped.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}

/// Arms `fd` to fire once at `deadline`; arming discards the expirations of
/// the earlier arming not read yet.
fn arm(fd: &OwnedFd, deadline: Instant) -> io::Result<()> {
    let nanos = monotonic_nanos(deadline).max(1);
    let value = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(nanos / NANOS_PER_SEC).unwrap_or(libc::time_t::MAX),
            tv_nsec: (nanos % NANOS_PER_SEC) as libc::c_long,
        },
    };
    // SAFETY: `value` is a valid itimerspec for the whole call; the old value
    // is not asked for.
    let set = unsafe {
        libc::timerfd_settime(
            fd.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &value,
            std::ptr::null_mut(),
        )
    };
    if set < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the expiration count: `WouldBlock` while the timer has not fired.
fn read_expirations(fd: &OwnedFd) -> io::Result<()> {
    let mut count = [0u8; 8];
    loop {
        // SAFETY: `count` is valid for writes of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_of_periods_that_divide_one_another_share_their_points() {
        let now = Instant::now();
        let (fine, coarse) = (Duration::from_millis(500), Duration::from_secs(1));
        let next = next_on_grid(now, fine);
        assert!(next > now && next <= now + fine, "{:?}", next - now);
        assert_eq!(monotonic_nanos(next) % fine.as_nanos(), 0);
        // Each point of the coarse grid is one of the fine grid.
        let coarse_point = next_on_grid(now, coarse);
        let mut point = next;
        while point < coarse_point {
            point = next_on_grid(point, fine);
        }
        assert_eq!(point, coarse_point);
        // The next point after a point is one period on.
        assert_eq!(next_on_grid(next, fine), next + fine);
        // A period of zero does not loop.
        assert!(next_on_grid(now, Duration::ZERO) > now);
    }

    #[test]
    fn instants_map_to_the_clock_and_back() {
        let now = Instant::now();
        for instant in [
            now,
            now + Duration::from_millis(1234),
            now - Duration::from_millis(5),
        ] {
            assert_eq!(from_monotonic_nanos(monotonic_nanos(instant)), instant);
        }
    }

    #[tokio::test]
    async fn an_alarm_fires_at_its_deadline_not_before() {
        let mut alarm = Alarm::new();
        assert!(alarm.fd.is_some(), "this test wants a timerfd");
        let started = Instant::now();
        let deadline = started + Duration::from_millis(80);
        alarm.sleep_until(deadline).await;
        assert!(Instant::now() >= deadline);
        // A deadline in the past returns at once, and the alarm can be
        // used again.
        alarm.sleep_until(started).await;
        let again = Instant::now() + Duration::from_millis(20);
        alarm.sleep_until(again).await;
        assert!(Instant::now() >= again);
    }

    /// Tickers made at different moments, with periods that divide one
    /// another, fire at the same instants: one wake-up for all of them.
    #[tokio::test]
    async fn tickers_made_at_different_moments_tick_together() {
        let period = Duration::from_millis(100);
        let mut first = Ticker::new(period);
        let mut coarse = Ticker::new(period * 2);
        first.tick().await;
        let mut second = Ticker::new(period);
        for _ in 0..3 {
            let (a, b) = (first.tick().await, second.tick().await);
            assert_eq!(a, b);
            assert!(Instant::now() >= a);
        }
        let coarse_point = coarse.tick().await;
        assert_eq!(monotonic_nanos(coarse_point) % period.as_nanos(), 0);
    }

    #[tokio::test]
    async fn a_ticker_starting_now_ticks_at_once_then_on_the_grid() {
        let period = Duration::from_millis(100);
        let made = Instant::now();
        let mut ticker = Ticker::starting_now(period);
        let first = ticker.tick().await;
        assert!(first >= made && first < made + period / 2, "at once");
        let second = ticker.tick().await;
        assert_eq!(
            monotonic_nanos(second) % period.as_nanos(),
            0,
            "on the grid"
        );
        // The next point after the first tick returned: within a period of it,
        // give or take the moment the tick itself took.
        assert!(second > first && second < first + period + period / 2);
    }

    #[tokio::test]
    async fn a_wait_dropped_and_begun_again_still_fires_once_its_deadline_came() {
        let mut alarm = Alarm::new();
        // Far enough that a busy machine cannot let the deadline pass
        // before the drop.
        let deadline = Instant::now() + Duration::from_millis(500);
        // Dropped before its deadline, after arming.
        let dropped = tokio::time::timeout(Duration::from_millis(5), alarm.sleep_until(deadline));
        assert!(dropped.await.is_err(), "fired early");
        assert_eq!(alarm.armed, Some(deadline), "still armed");
        alarm.sleep_until(deadline).await;
        assert!(Instant::now() >= deadline);
        // Re-armed for a later deadline, a stale readiness does not end the
        // wait early.
        let later = Instant::now() + Duration::from_millis(30);
        alarm.sleep_until(later).await;
        assert!(Instant::now() >= later);
    }
}
