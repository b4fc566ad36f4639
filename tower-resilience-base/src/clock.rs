//! [`CoarseClock`]: a reading of the real clock that one background thread
//! advances every millisecond, read with one atomic load instead of a
//! clock read, for the layers that can trade a bounded error for speed
//! (`BreakerConfig::coarse_clock` in `tower-breaker`,
//! `ClientDeadlineLayer::coarse_clock` in `tower-deadline`).

// The coarse clock is the real clock by design: it does not follow
// tokio's paused test clock, as documented on `CoarseClock`.
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// How often the shared clock's thread advances it.
pub const TICK: Duration = Duration::from_millis(1);

/// A reading of the real clock, as nanoseconds since its origin, advanced
/// by whoever ticks it: for [`shared`](CoarseClock::shared), one
/// background thread per process (named `tower-resilience-clock`, started
/// on first use) every [`TICK`]; for a [`manual`](CoarseClock::manual)
/// clock, the test that owns it.
///
/// Its error, by construction: a reading is a past reading of the real
/// clock, so it is never ahead of it; readings never go backwards; a
/// reading of the shared clock lags the real clock by at most one tick
/// plus the delay the operating system adds to the thread's wake-ups (more
/// on a loaded machine). It follows the real clock, not tokio's paused test
/// clock: code that reads it does not see `tokio::time::advance`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::clock::CoarseClock;
///
/// let clock = CoarseClock::shared().expect("the clock's thread starts");
/// let before = clock.now();
/// assert!(before <= tokio::time::Instant::now(), "never ahead of the real clock");
///
/// // A clock that only its owner moves, for tests:
/// let manual = CoarseClock::manual();
/// let start = manual.now();
/// manual.advance(Duration::from_millis(5));
/// assert_eq!(manual.now() - start, Duration::from_millis(5));
/// ```
#[derive(Debug)]
pub struct CoarseClock {
    origin: std::time::Instant,
    ns: AtomicU64,
}

impl CoarseClock {
    /// The process's clock, its thread started on first use; `None` when
    /// the thread cannot be started (the caller then reads the real clock;
    /// a `coarse_clock_unavailable` warning says so once).
    #[must_use]
    pub fn shared() -> Option<&'static CoarseClock> {
        static CLOCK: LazyLock<CoarseClock> =
            LazyLock::new(|| CoarseClock::at(std::time::Instant::now()));
        static TICKING: OnceLock<bool> = OnceLock::new();
        let ticking = *TICKING.get_or_init(|| {
            let clock: &'static CoarseClock = &CLOCK;
            let spawned = std::thread::Builder::new()
                .name("tower-resilience-clock".into())
                .spawn(move || loop {
                    std::thread::sleep(TICK);
                    clock.advance_to(clock.origin.elapsed());
                });
            if let Err(e) = &spawned {
                tracing::warn!(
                    error = %e,
                    "coarse_clock_unavailable: could not start the coarse clock's \
                     thread; layers configured with it read the real clock"
                );
            }
            spawned.is_ok()
        });
        ticking.then_some(&*CLOCK)
    }

    /// A clock that reads the real time now and moves only when
    /// [`advance`](CoarseClock::advance)d: for tests of code that tells
    /// time by a coarse clock. It lives as long as the process (it is
    /// leaked, as the shared one is static).
    #[must_use]
    pub fn manual() -> &'static CoarseClock {
        Box::leak(Box::new(CoarseClock::at(std::time::Instant::now())))
    }

    fn at(origin: std::time::Instant) -> Self {
        Self {
            origin,
            ns: AtomicU64::new(0),
        }
    }

    /// Moves the reading `by` forward.
    pub fn advance(&self, by: Duration) {
        self.ns.fetch_add(nanos(by), Relaxed);
    }

    /// Moves the reading to `elapsed` since the origin; never backwards.
    fn advance_to(&self, elapsed: Duration) {
        self.ns.fetch_max(nanos(elapsed), Relaxed);
    }

    /// The latest reading, in nanoseconds since the clock's
    /// [`origin`](CoarseClock::origin): one atomic load.
    #[inline]
    #[must_use]
    pub fn nanos(&self) -> u64 {
        self.ns.load(Relaxed)
    }

    /// The latest reading, as an instant.
    #[inline]
    #[must_use]
    pub fn now(&self) -> Instant {
        Instant::from_std(self.origin) + Duration::from_nanos(self.nanos())
    }

    /// The instant readings count from.
    #[must_use]
    pub fn origin(&self) -> Instant {
        Instant::from_std(self.origin)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_never_go_backwards() {
        let clock = CoarseClock::at(std::time::Instant::now());
        clock.advance_to(Duration::from_millis(5));
        clock.advance_to(Duration::from_millis(3));
        assert_eq!(clock.nanos(), 5_000_000);
        clock.advance_to(Duration::from_millis(8));
        assert_eq!(clock.nanos(), 8_000_000);
    }

    #[test]
    fn the_shared_clock_is_never_ahead_of_the_real_one_and_keeps_moving() {
        let clock = CoarseClock::shared().expect("the ticking thread starts");
        let first = clock.nanos();
        let mut last = first;
        // Spin (no sleep) until the thread has moved the reading, checking
        // every reading against the real clock read after it.
        while last == first {
            last = clock.nanos();
            let real = nanos(clock.origin.elapsed());
            assert!(last <= real, "coarse {last} ahead of real {real}");
            std::hint::spin_loop();
        }
        assert!(last > first);
    }

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let clock = CoarseClock::manual();
        let start = clock.now();
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_millis(2));
        assert_eq!(clock.now() - start, Duration::from_millis(2));
        assert_eq!(clock.origin(), start);
    }
}
