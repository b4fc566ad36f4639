//! The coarse clock of [`BreakerConfig::coarse_clock`](crate::BreakerConfig::coarse_clock):
//! a reading of the real clock that one background thread advances every
//! [`TICK`], read with one atomic load instead of a clock read.
//!
//! Its error, by construction: a reading is a past reading of the real
//! clock (never ahead of it), readings never go backwards, and a reading
//! lags the real clock by at most one tick plus the delay the operating
//! system adds to the ticking thread's wake-ups (on a loaded machine, more
//! than a tick).

// The coarse clock is the real clock by design (documented on
// `BreakerConfig::coarse_clock`: it does not follow paused test time).
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use crate::breaker::nanos;

/// How often the ticking thread advances the shared coarse clock.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// A reading of the real clock, as nanoseconds since `origin`, advanced by
/// whoever ticks it.
#[derive(Debug)]
pub(crate) struct Coarse {
    origin: Instant,
    ns: AtomicU64,
}

impl Coarse {
    pub(crate) fn new(origin: Instant) -> Self {
        Self {
            origin,
            ns: AtomicU64::new(0),
        }
    }

    /// Moves the reading to `elapsed` since the origin; never backwards.
    pub(crate) fn advance(&self, elapsed: Duration) {
        self.ns.fetch_max(nanos(elapsed), Relaxed);
    }

    /// Moves the reading to the real clock's time now.
    fn tick(&self) {
        self.advance(self.origin.elapsed());
    }

    /// The latest reading, in nanoseconds since the origin.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.ns.load(Relaxed)
    }

    /// Nanoseconds from the origin to `at` (0 for an earlier `at`): what a
    /// breaker whose times count from `at` subtracts from the readings.
    pub(crate) fn offset_of(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.origin))
    }
}

/// The process's coarse clock, its ticking thread started on first use;
/// `None` when the thread cannot be started (the breaker then reads the
/// real clock).
pub(crate) fn shared() -> Option<&'static Coarse> {
    static CLOCK: LazyLock<Coarse> = LazyLock::new(|| Coarse::new(Instant::now()));
    static TICKING: OnceLock<bool> = OnceLock::new();
    let ticking = *TICKING.get_or_init(|| {
        let clock: &'static Coarse = &CLOCK;
        let spawned = std::thread::Builder::new()
            .name("tower-breaker-clock".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                clock.tick();
            });
        if let Err(e) = &spawned {
            tracing::warn!(
                error = %e,
                "breaker_coarse_clock_unavailable: could not start its thread; \
                 breakers configured with coarse_clock read the real clock"
            );
        }
        spawned.is_ok()
    });
    ticking.then_some(&*CLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_never_go_backwards() {
        let clock = Coarse::new(Instant::now());
        clock.advance(Duration::from_millis(5));
        clock.advance(Duration::from_millis(3));
        assert_eq!(clock.now_ns(), 5_000_000);
        clock.advance(Duration::from_millis(8));
        assert_eq!(clock.now_ns(), 8_000_000);
    }

    #[test]
    fn the_shared_clock_is_never_ahead_of_the_real_one_and_keeps_moving() {
        let clock = shared().expect("the ticking thread starts");
        let first = clock.now_ns();
        let mut last = first;
        // Spin (no sleep) until the ticker has moved the reading, checking
        // every reading against the real clock read after it.
        while last == first {
            last = clock.now_ns();
            let real = nanos(clock.origin.elapsed());
            assert!(last <= real, "coarse {last} ahead of real {real}");
            std::hint::spin_loop();
        }
        assert!(last > first);
    }

    #[test]
    fn offsets_count_from_the_origin() {
        let origin = Instant::now();
        let clock = Coarse::new(origin);
        assert_eq!(
            clock.offset_of(origin + Duration::from_millis(2)),
            2_000_000
        );
        assert_eq!(clock.offset_of(origin), 0);
    }
}
