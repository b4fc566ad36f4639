//! [`CoarseClock`]: a reading of the real clock that one background thread
//! advances every millisecond while something reads it, read with one
//! atomic load instead of a clock read, for the layers that can trade a
//! bounded error for speed (`BreakerConfig::coarse_clock` in
//! `tower-breaker`, `ClientDeadlineLayer::coarse_clock` in
//! `tower-deadline`).

// The coarse clock is the real clock by design: it does not follow
// tokio's paused test clock, as documented on `CoarseClock`.
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use Ordering::{AcqRel, Acquire, Relaxed, Release};

use tokio::time::Instant;

/// How often the shared clock's thread advances it.
pub const TICK: Duration = Duration::from_millis(1);

/// How many ticks without a reading before the shared clock's thread
/// sleeps until the next one: 100 (100 ms).
pub const IDLE_TICKS: u32 = 100;

/// `state`: somebody read the clock since the last tick.
const READ: u8 = 1;
/// `state`: the ticking thread sleeps until a reading wakes it; readings
/// read the real clock meanwhile.
const PARKED: u8 = 2;

/// A reading of the real clock, as nanoseconds since its origin, advanced
/// by whoever ticks it: for [`shared`](CoarseClock::shared), one
/// background thread per process (named `tower-resilience-clock`, started
/// on first use) every [`TICK`] while the clock is read; for a
/// [`manual`](CoarseClock::manual) clock, the test that owns it.
///
/// A thread that wakes every millisecond costs every other thread of the
/// process (on a 2-vCPU virtual machine, a 1 kHz wake-up took a fifth of
/// the requests per second of a reqwest client in the same process), so
/// the shared clock's thread sleeps after [`IDLE_TICKS`] ticks without a
/// reading. While it sleeps, a reading reads the real clock (and the
/// first one wakes the thread): a process that stopped calling pays
/// nothing, one that calls gets the coarse clock back within a tick.
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
    /// [`READ`] and [`PARKED`].
    state: AtomicU8,
    /// The ticking thread, once it parks for the first time.
    ticker: OnceLock<Thread>,
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
                .spawn(move || clock.tick_while_read(TICK, IDLE_TICKS));
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
            state: AtomicU8::new(0),
            ticker: OnceLock::new(),
        }
    }

    /// The ticking thread's loop: advance every `tick`, and after `idle`
    /// ticks without a reading, park until a reading unparks it.
    fn tick_while_read(&'static self, tick: Duration, idle: u32) -> ! {
        let mut unread = 0;
        loop {
            std::thread::sleep(tick);
            self.advance_to(self.origin.elapsed());
            if self.state.fetch_and(!READ, AcqRel) & READ != 0 {
                unread = 0;
                continue;
            }
            unread += 1;
            if unread < idle {
                continue;
            }
            self.ticker.get_or_init(std::thread::current);
            // From here on, readings read the real clock. One that came
            // between the last tick and this store read a reading at most
            // a tick old, as any.
            self.state.fetch_or(PARKED, AcqRel);
            while self.state.load(Acquire) & PARKED != 0 {
                std::thread::park();
            }
            unread = 0;
        }
    }

    /// A reading while the ticking thread sleeps: the real clock, stored
    /// so that the readings after it are never behind it; wakes the
    /// thread.
    #[cold]
    fn wake(&self) -> u64 {
        let now = nanos(self.origin.elapsed());
        self.ns.fetch_max(now, Release);
        if self.state.fetch_and(!PARKED, AcqRel) & PARKED != 0 {
            if let Some(ticker) = self.ticker.get() {
                ticker.unpark();
            }
        }
        now.max(self.ns.load(Acquire))
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
    /// [`origin`](CoarseClock::origin): two atomic loads (and, once per
    /// tick, a store to say the clock is in use); the real clock while the
    /// ticking thread sleeps.
    #[inline]
    #[must_use]
    pub fn nanos(&self) -> u64 {
        let state = self.state.load(Acquire);
        if state != READ {
            if state & PARKED != 0 {
                return self.wake();
            }
            self.state.fetch_or(READ, Relaxed);
        }
        self.ns.load(Acquire)
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

    /// Where this clock's [`origin`](CoarseClock::origin) lies from
    /// `base`, in signed nanoseconds (negative when the clock was started
    /// before `base`): what [`nanos_since`](CoarseClock::nanos_since) takes
    /// to tell the time since `base`, for code that counts its time from an
    /// instant of its own.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tower_resilience_base::clock::CoarseClock;
    ///
    /// let base = Instant::now();
    /// let clock = CoarseClock::manual(); // started after `base`
    /// let offset = clock.offset_from(base);
    /// assert!(offset >= 0);
    /// clock.advance(Duration::from_millis(5));
    /// assert_eq!(clock.nanos_since(offset), offset as u64 + 5_000_000);
    /// ```
    #[must_use]
    pub fn offset_from(&self, base: Instant) -> i64 {
        let origin = self.origin();
        let signed = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match origin.checked_duration_since(base) {
            Some(after) => signed(after),
            None => -signed(base - origin),
        }
    }

    /// The latest reading in nanoseconds since the instant `offset` was
    /// taken from ([`offset_from`](CoarseClock::offset_from)); 0 for a
    /// reading before it.
    #[inline]
    #[must_use]
    pub fn nanos_since(&self, offset: i64) -> u64 {
        let since_origin = i64::try_from(self.nanos()).unwrap_or(i64::MAX);
        u64::try_from(since_origin.saturating_add(offset)).unwrap_or(0)
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

    /// Waits (polling the real clock, at most 5 s) until `done`.
    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(5), "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_ticking_thread_sleeps_when_unread_and_a_reading_wakes_it() {
        let clock: &'static CoarseClock =
            Box::leak(Box::new(CoarseClock::at(std::time::Instant::now())));
        std::thread::spawn(move || clock.tick_while_read(Duration::from_millis(1), 5));
        // Read: it ticks.
        let first = clock.nanos();
        wait_for("ticked", || clock.nanos() > first);
        // Unread for 5 ticks: it parks, and the reading stands still.
        wait_for("parked", || clock.state.load(Acquire) & PARKED != 0);
        let parked_at = clock.ns.load(Acquire);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.ns.load(Acquire), parked_at, "no tick while parked");
        // A reading meanwhile is the real clock's, never behind an earlier
        // one, and wakes the thread.
        let real_before = nanos(clock.origin.elapsed());
        let woken = clock.nanos();
        assert!(woken >= real_before, "{woken} < {real_before}");
        assert!(woken >= parked_at + 20_000_000);
        // Woken: it ticks again (unread, it may park again later).
        wait_for("ticked again", || clock.ns.load(Acquire) > woken);
        // Readings never go backwards across sleeps and wake-ups.
        let mut last = clock.nanos();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            let now = clock.nanos();
            assert!(now >= last, "{now} < {last}");
            last = now;
            if start.elapsed().as_millis() % 20 < 10 {
                // Unread for a while: it may park.
                std::thread::sleep(Duration::from_millis(8));
            }
        }
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
