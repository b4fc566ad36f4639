//! Closed → open → half-open → closed, with paused time: every threshold at
//! one call below, at and above, every timed transition one tick before and
//! after.

mod support;

use std::time::Duration;

use support::*;
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, Outcome, SeededRandom, State};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failure_rate_threshold_below_at_and_above() {
    // Window 10, minimum 10, 50%: 4 failures among 10 stay closed...
    let b = breaker(10);
    record(&b, Outcome::Success, 6);
    record(&b, Outcome::Failure, 4);
    assert_eq!(state(&b), State::Closed);
    // ...the 5th failure (5 of 10) opens.
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open);

    // Above: 6 of 10 after the window slides (fresh breaker).
    let b = breaker(10);
    record(&b, Outcome::Success, 4);
    record(&b, Outcome::Failure, 5);
    assert_eq!(state(&b), State::Closed, "9 calls: below the minimum");
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open, "6 of 10 is above 50%");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn minimum_calls_below_at_and_above() {
    let b = Breaker::with_config("t", config().count_window(100).minimum_calls(5));
    record(&b, Outcome::Failure, 4);
    assert_eq!(state(&b), State::Closed, "4 calls, below the minimum of 5");
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open, "at the minimum");

    let b = Breaker::with_config("t", config().count_window(100).minimum_calls(5));
    record(&b, Outcome::Success, 5);
    record(&b, Outcome::Failure, 5);
    assert_eq!(state(&b), State::Open, "above the minimum, at 50%");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failure_rate_threshold_is_configurable() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(10)
            .minimum_calls(10)
            .failure_rate(0.3),
    );
    record(&b, Outcome::Success, 8);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Closed, "20% < 30%");
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open, "30% reaches 30%");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn consecutive_failures_below_at_and_above() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(100)
            .minimum_calls(100)
            .consecutive_failures(3),
    );
    record(&b, Outcome::Failure, 2);
    record(&b, Outcome::Success, 1);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Closed, "a success resets the run");
    assert_eq!(b.snapshot().consecutive_failures, 2);
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn slow_call_rate_opens() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(4)
            .minimum_calls(4)
            .slow_calls(ms(100), 0.5),
    );
    for elapsed in [99, 99, 100] {
        b.try_acquire()
            .unwrap()
            .record_with_elapsed(Outcome::Success, ms(elapsed));
    }
    b.try_acquire()
        .unwrap()
        .record_with_elapsed(Outcome::Success, ms(10));
    assert_eq!(state(&b), State::Closed, "1 slow of 4");
    b.try_acquire()
        .unwrap()
        .record_with_elapsed(Outcome::Success, ms(150));
    let s = b.snapshot();
    assert_eq!(s.state, State::Open, "2 slow of 4 reaches 50%");
    assert_eq!(s.totals.slow, 2);

    // Measured by the permit itself, with paused time.
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .slow_calls(ms(100), 1.0),
    );
    let permit = b.try_acquire().unwrap();
    advance(ms(100)).await;
    permit.record(Outcome::Success);
    assert_eq!(state(&b), State::Open);
}

/// A permit times its call from the call's own start, not the breaker's:
/// on a breaker built 10 s ago, a call of 99 ms is not slow, one of 100 ms
/// is.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_is_timed_from_its_own_start() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .slow_calls(ms(100), 1.0),
    );
    advance(secs(10)).await;
    let permit = b.try_acquire().unwrap();
    advance(ms(99)).await;
    permit.record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().totals.slow, 0);
    let permit = b.try_acquire().unwrap();
    advance(ms(100)).await;
    permit.record(Outcome::Success);
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn open_rejects_then_half_opens_one_tick_after_the_period() {
    let b = breaker(2);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Open);

    let err = b.try_acquire().unwrap_err();
    assert_eq!(err.breaker(), "test");
    assert_eq!(err.retry_after(), secs(5));

    advance(secs(5) - ms(1)).await;
    let err = b.try_acquire().unwrap_err();
    assert_eq!(err.retry_after(), ms(1));
    assert_eq!(b.snapshot().retry_after, Some(ms(1)));

    advance(ms(2)).await;
    // The snapshot shows the lapse; the next call moves the state.
    assert_eq!(state(&b), State::Open);
    assert_eq!(b.snapshot().retry_after, Some(Duration::ZERO));
    let probe = b
        .try_acquire()
        .expect("the first call after the period probes");
    assert!(probe.is_probe());
    assert_eq!(state(&b), State::HalfOpen);
    probe.record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().window.calls, 0, "a fresh window");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn admission_takes_the_time_a_layer_above_read_for_the_call() {
    // One clock read per call for the whole stack: the breaker judges the
    // open period by the reading in the call context when a layer above
    // made one, and reads the clock itself only when none did.
    use tokio::time::Instant;
    use tower_resilience_base::CallContext;

    let b = breaker(2);
    record(&b, Outcome::Failure, 2);
    advance(secs(2)).await;
    let at = |now: Instant| {
        CallContext::scoped(|cx| cx.set_now(now), || b.try_acquire())
            .map(|permit| permit.is_probe())
            .map_err(|e| e.retry_after())
    };
    assert_eq!(b.try_acquire().unwrap_err().retry_after(), secs(3));
    assert_eq!(at(Instant::now() + secs(1)), Err(secs(2)));
    // A reading past the period admits the probe, as the clock would then.
    assert_eq!(at(Instant::now() + secs(3) + ms(1)), Ok(true));
    assert_eq!(state(&b), State::HalfOpen);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_open_period_grows_on_each_reopen_and_is_capped() {
    let b = breaker(1);
    record(&b, Outcome::Failure, 1);
    for expected in [5, 10, 20, 40, 60, 60] {
        assert_eq!(b.try_acquire().unwrap_err().retry_after(), secs(expected));
        advance(secs(expected) - ms(1)).await;
        assert!(
            b.try_acquire().is_err(),
            "still open 1 ms before {expected} s"
        );
        advance(ms(1)).await;
        let probe = b.try_acquire().expect("probe");
        probe.record(Outcome::Failure);
        assert_eq!(state(&b), State::Open);
    }
    // A success resets the growth.
    advance(secs(60)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    record(&b, Outcome::Failure, 1);
    assert_eq!(b.try_acquire().unwrap_err().retry_after(), secs(5));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_open_period_is_jittered_within_bounds_and_reproducible() {
    let periods = |seed: u64| {
        let b = Breaker::with_config(
            "t",
            tower_breaker::BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .jitter(0.1)
                .random(SeededRandom::new(seed)),
        );
        let mut seen = Vec::new();
        for _ in 0..20 {
            b.set_mode(tower_breaker::Mode::Automatic);
            record(&b, Outcome::Failure, 1);
            seen.push(b.try_acquire().unwrap_err().retry_after());
        }
        seen
    };
    let a = periods(1);
    for p in &a {
        assert!(*p >= ms(4500) && *p <= ms(5500), "{p:?} outside 5 s ± 10%");
    }
    assert!(a.iter().any(|p| *p != a[0]), "jitter varies the period");
    assert_eq!(a, periods(1), "the same seed gives the same periods");
    assert_ne!(a, periods(2));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn max_half_open_wait_reopens_one_tick_after() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .max_half_open_wait(secs(30)),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    let probe = b.try_acquire().unwrap();
    assert_eq!(state(&b), State::HalfOpen);

    advance(secs(30) - ms(1)).await;
    assert!(b.try_acquire().is_err(), "the probe slot is taken");
    assert_eq!(state(&b), State::HalfOpen);
    advance(ms(1)).await;
    assert!(b.try_acquire().is_err());
    assert_eq!(
        state(&b),
        State::Open,
        "re-opened: the probe never answered"
    );
    assert_eq!(
        b.try_acquire().unwrap_err().retry_after(),
        secs(10),
        "with the longer period"
    );
    // The hung probe's late success is stale.
    probe.record(Outcome::Success);
    assert_eq!(state(&b), State::Open);
    assert_eq!(b.snapshot().totals.stale, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn several_successes_needed_to_close() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .successes_to_close(3),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    for i in 0..2 {
        let p = b.try_acquire().unwrap();
        assert!(p.is_probe());
        p.record(Outcome::Success);
        assert_eq!(state(&b), State::HalfOpen, "after {} successes", i + 1);
    }
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn transitions_reach_the_listener_and_the_totals() {
    let seen = Transitions::default();
    let causes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let c = causes.clone();
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(2)
            .minimum_calls(2)
            .listener(seen.listener())
            .listener(move |t: &tower_breaker::Transition| c.lock().unwrap().push(t.cause)),
    );
    // (The second listener replaces the first.)
    record(&b, Outcome::Failure, 2);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(
        *causes.lock().unwrap(),
        [
            Cause::FailureRate,
            Cause::OpenPeriodOver,
            Cause::ProbesSucceeded
        ]
    );
    let s = b.snapshot();
    assert_eq!(s.totals.opened, 1);
    assert_eq!(s.totals.failed, 2);
    assert_eq!(s.totals.successful, 1);
    assert!(s.last_transition.is_some());

    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .listener(seen.listener()),
    );
    record(&b, Outcome::Failure, 1);
    assert_eq!(seen.seen(), [(State::Closed, State::Open)]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ramp_up_admits_a_growing_share() {
    let b = Breaker::with_config(
        "t",
        config().count_window(1).minimum_calls(1).ramp_up(secs(10)),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);

    let admitted = |b: &Breaker| {
        (0..1000)
            .filter(|_| match b.try_acquire() {
                Ok(p) => {
                    p.record(Outcome::Ignored);
                    true
                }
                Err(e) => {
                    assert_eq!(e.retry_after(), Duration::ZERO);
                    false
                }
            })
            .count()
    };
    advance(ms(1)).await;
    assert!(admitted(&b) < 50, "almost nothing at the start");
    advance(secs(5)).await;
    let half = admitted(&b);
    assert!((400..600).contains(&half), "about half midway: {half}");
    advance(secs(5)).await;
    assert_eq!(admitted(&b), 1000, "everything once the ramp is over");
}

/// A transition at the breaker's very first instant is reported like any
/// other: the snapshot says when the last one happened.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_transition_at_the_first_instant_is_reported() {
    let start = tokio::time::Instant::now();
    let b = breaker(1);
    assert_eq!(b.snapshot().last_transition, None);
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open);
    assert_eq!(b.snapshot().last_transition, Some(start));
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().last_transition, Some(start + secs(5)));
}

/// A random source that always draws `value`, and counts its draws.
#[derive(Debug)]
struct FixedDraw {
    value: u64,
    draws: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tower_breaker::random::RandomSource for FixedDraw {
    fn next_u64(&self) -> u64 {
        self.draws
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.value
    }
}

/// One half, as a draw of a [`FixedDraw`].
const HALF: u64 = 1 << 63;
/// Three quarters, as a draw of a [`FixedDraw`].
const THREE_QUARTERS: u64 = 3 << 62;

/// A call is admitted while ramping up when its draw is below the share
/// of the ramp gone by: a draw of one half is refused until just after
/// the ramp's middle. At the ramp's end, one tick exactly, the ramp is
/// over: no more draws, the closed fast path again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_ramp_admits_below_its_share_and_ends_on_time() {
    let draws = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let drawn = || draws.load(std::sync::atomic::Ordering::Relaxed);
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .ramp_up(secs(10))
            .random(FixedDraw {
                value: HALF,
                draws: draws.clone(),
            }),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(state(&b), State::Closed, "the ramp starts now");
    let admitted = |b: &Breaker| b.try_acquire().map(|p| p.record(Outcome::Ignored)).is_ok();

    advance(secs(5) - ms(1)).await;
    assert!(!admitted(&b), "share just below one half");
    advance(ms(1)).await;
    assert!(!admitted(&b), "share one half: the draw is not below it");
    advance(ms(1)).await;
    assert!(admitted(&b), "share just above one half");

    // One tick before the end: still ramping, still drawing.
    advance(secs(5) - ms(2)).await;
    let before = drawn();
    assert!(admitted(&b));
    assert_eq!(drawn(), before + 1, "the last tick of the ramp draws");
    advance(ms(1)).await;
    let before = drawn();
    assert!((0..10).all(|_| admitted(&b)), "the ramp is over");
    assert_eq!(drawn(), before, "no draw once the ramp is over");
}

/// With `successes_to_close = 3` and calls further apart than the
/// half-open wait, every probe succeeds and the circuit closes: the wait
/// is per probe, not per half-open period.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn sparse_successful_probes_close_however_far_apart() {
    let seen = Transitions::default();
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .successes_to_close(3)
            .max_half_open_wait(secs(30))
            .listener(seen.listener()),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    for i in 0..3 {
        let probe = b.try_acquire().expect("a probe slot is free");
        assert!(probe.is_probe());
        advance(ms(10)).await;
        probe.record(Outcome::Success);
        if i < 2 {
            assert_eq!(state(&b), State::HalfOpen, "after {} successes", i + 1);
            // Longer than the whole wait until the next call.
            advance(secs(45)).await;
        }
    }
    assert_eq!(state(&b), State::Closed);
    assert_eq!(
        seen.seen(),
        vec![
            (State::Closed, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed)
        ],
        "never re-opened as timed out"
    );
}

/// Each probe gets the whole wait from its own admission: one tick before
/// its timeout the circuit is still half-open, at the tick it re-opens.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_probe_times_out_one_wait_after_its_own_admission() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .successes_to_close(3)
            .max_half_open_wait(secs(30)),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    // The second probe starts 20 s into half-open, and hangs.
    advance(secs(20)).await;
    let hung = b.try_acquire().expect("second probe");
    advance(secs(30) - ms(1)).await;
    assert!(b.try_acquire().is_err(), "its slot is held");
    assert_eq!(state(&b), State::HalfOpen, "one tick before its timeout");
    advance(ms(1)).await;
    let refused = b.try_acquire().unwrap_err();
    assert_eq!(state(&b), State::Open, "at its timeout");
    assert_eq!(
        refused.retry_after(),
        secs(10),
        "re-opened with the longer period"
    );
    drop(hung);
    assert_eq!(state(&b), State::Open);
}

/// Callers refused while a probe is out are told to come back about when it
/// should finish (from the last probe's duration), not after the whole
/// half-open wait.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn refused_while_half_open_retry_after_the_expected_probe_end() {
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .successes_to_close(2)
            .max_half_open_wait(secs(30)),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;

    // No probe has finished yet: one second, not thirty.
    let first = b.try_acquire().unwrap();
    let refused = b.try_acquire().unwrap_err();
    assert_eq!(refused.retry_after(), secs(1));
    assert_eq!(b.snapshot().retry_after, Some(secs(1)));
    advance(ms(200)).await;
    first.record(Outcome::Success);
    assert_eq!(
        b.snapshot().retry_after,
        Some(Duration::ZERO),
        "a slot is free"
    );

    // The first probe took 200 ms: the next one should too.
    let second = b.try_acquire().unwrap();
    advance(ms(50)).await;
    assert_eq!(b.try_acquire().unwrap_err().retry_after(), ms(150));
    // Overdue: one more such duration, never beyond the probe's timeout.
    advance(ms(250)).await;
    assert_eq!(b.try_acquire().unwrap_err().retry_after(), ms(200));
    advance(secs(30) - ms(300) - ms(100)).await;
    assert_eq!(b.try_acquire().unwrap_err().retry_after(), ms(100));
    second.record(Outcome::Success);
    assert_eq!(state(&b), State::Closed);
}

/// The periods of 40 re-opens in a row of a breaker with jitter from `seed`.
async fn reopen_periods(seed: u64) -> Vec<Duration> {
    let b = Breaker::with_config(
        "t",
        tower_breaker::BreakerConfig::new()
            .count_window(1)
            .minimum_calls(1)
            .open_period(secs(5))
            .max_open_period(secs(60))
            .jitter(0.1)
            .random(SeededRandom::new(seed)),
    );
    record(&b, Outcome::Failure, 1);
    let mut periods = Vec::new();
    for _ in 0..40 {
        let period = b.try_acquire().unwrap_err().retry_after();
        periods.push(period);
        advance(period).await;
        b.try_acquire().expect("probe").record(Outcome::Failure);
    }
    periods
}

/// Once the period reaches its cap it keeps its jitter: periods stay
/// within the cap ± jitter, vary between re-opens, and differ between two
/// breakers.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn periods_at_the_cap_stay_jittered() {
    let a = reopen_periods(11).await;
    // 5, 10, 20, 40 s, then the 60 s cap from the 5th opening on.
    let capped = &a[4..];
    for p in capped {
        assert!(
            *p >= ms(54_000) && *p <= ms(66_000),
            "{p:?} outside 60 s ± 10%"
        );
    }
    let distinct: std::collections::HashSet<_> = capped.iter().collect();
    assert!(
        distinct.len() > capped.len() / 2,
        "jittered at the cap: {capped:?}"
    );
    let b = reopen_periods(12).await;
    assert_ne!(&a[4..], &b[4..], "two breakers do not probe in lockstep");
}

/// Outcomes discarded as stale are counted only as stale.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stale_outcomes_are_not_counted_as_failed_or_successful() {
    let b = breaker(2);
    let late_failure = b.try_acquire().unwrap();
    let late_success = b.try_acquire().unwrap();
    b.set_mode(tower_breaker::Mode::Automatic); // a reset: a new generation
    late_failure.record(Outcome::Failure);
    late_success.record(Outcome::Success);
    let totals = b.snapshot().totals;
    assert_eq!(totals.stale, 2);
    assert_eq!((totals.failed, totals.successful), (0, 0));
}

/// Transitions out of half-open report the probes' outcomes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn transitions_out_of_half_open_carry_the_probe_counts() {
    let windows = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = windows.clone();
    let b = Breaker::with_config(
        "t",
        config()
            .count_window(1)
            .minimum_calls(1)
            .successes_to_close(3)
            .listener(move |t: &tower_breaker::Transition| {
                log.lock()
                    .unwrap()
                    .push((t.to, t.cause, t.window.calls, t.window.failures));
            }),
    );
    record(&b, Outcome::Failure, 1);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    b.try_acquire().unwrap().record(Outcome::Failure);
    advance(secs(10)).await;
    for _ in 0..3 {
        b.try_acquire().unwrap().record(Outcome::Success);
    }
    let seen = windows.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (State::Open, Cause::FailureRate, 1, 1),
            (State::HalfOpen, Cause::OpenPeriodOver, 0, 0),
            (State::Open, Cause::ProbeFailed, 2, 1),
            (State::HalfOpen, Cause::OpenPeriodOver, 0, 0),
            (State::Closed, Cause::ProbesSucceeded, 3, 0),
        ]
    );
}

/// The open period is multiplied by `1 + jitter * (2u - 1)` for a draw
/// `u`: with a jitter of 0.5 and a draw of three quarters, 5 s becomes
/// 6.25 s. Without jitter, the period is exact and nothing is drawn.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_jitter_factor_is_exact_and_no_jitter_draws_nothing() {
    let opened = |jitter: f64| {
        let draws = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = Breaker::with_config(
            "t",
            config()
                .count_window(1)
                .minimum_calls(1)
                .jitter(jitter)
                .random(FixedDraw {
                    value: THREE_QUARTERS,
                    draws: draws.clone(),
                }),
        );
        record(&b, Outcome::Failure, 1);
        let period = b.try_acquire().unwrap_err().retry_after();
        (period, draws.load(std::sync::atomic::Ordering::Relaxed))
    };
    assert_eq!(opened(0.5), (ms(6250), 1));
    assert_eq!(opened(0.0), (secs(5), 0), "no jitter, no draw");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_client_breaker_that_needs_the_time_hands_its_reading_to_the_layers_below() {
    // One clock read per call, whichever layer reads first: a breaker
    // above the call's deadline (as `client_stack` puts it) that reads the
    // clock for every call (here, to time slow calls) leaves the reading
    // in the call's context for the deadline below; one that needs no time
    // makes no reading; one given a reading by a layer above keeps it.
    use http::{Request, Response};
    use tokio::time::Instant;
    use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
    use tower_breaker::BreakerLayer;
    use tower_resilience_base::CallContext;

    let seen_below = |breaker: Breaker, above: Option<Instant>| async move {
        let inner = service_fn(|_: Request<()>| {
            let now = CallContext::current(|cx| cx.now());
            std::future::ready(Ok::<_, BoxError>(Response::new(now)))
        });
        let mut svc = BreakerLayer::new(breaker).layer(inner);
        svc.ready().await.unwrap();
        // The layers below are called during `call`, in its context.
        let call = CallContext::scoped(
            |cx| {
                if let Some(now) = above {
                    cx.set_now(now);
                }
            },
            || svc.call(Request::new(())),
        );
        let seen = call.await.unwrap().into_body().into_inner();
        assert_eq!(
            CallContext::current(|cx| cx.now()),
            None,
            "the change is undone"
        );
        seen
    };
    let timing = || Breaker::with_config("timing", config().slow_calls(secs(1), 0.5));
    advance(secs(5)).await;
    assert_eq!(seen_below(timing(), None).await, Some(Instant::now()));
    assert_eq!(seen_below(breaker(4), None).await, None, "no reading made");
    let earlier = Instant::now() - secs(1);
    assert_eq!(seen_below(timing(), Some(earlier)).await, Some(earlier));
    // On the coarse clock (switched on live) its reading is one atomic
    // load, not worth handing down: it makes no reading of tokio's clock.
    let coarse = timing();
    let _ = coarse.reconfigure(coarse.config().coarse_clock(true));
    if coarse.config().get_coarse_clock() {
        assert_eq!(seen_below(coarse, None).await, None, "a coarse breaker");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn attempts_reported_through_the_hook_are_counted_and_open_the_circuit() {
    // A retry layer below a client breaker takes the breaker's attempt
    // hook and reports each attempt through it; here the inner service
    // stands in for it: two failed attempts in one call are two failures,
    // and the breaker counts nothing more itself for the call.
    use http::{Request, Response};
    use tower::{service_fn, BoxError, Layer, ServiceExt};
    use tower_breaker::BreakerLayer;
    use tower_resilience_base::hook::AttemptOutcome;
    use tower_resilience_base::CallContext;

    let b = Breaker::with_config("hooked", config().count_window(4).minimum_calls(4));
    let svc = BreakerLayer::new(b.clone()).layer(service_fn(|_: Request<()>| {
        let mut attempts = CallContext::take_attempts().expect("the breaker offers its hook");
        let reset = std::io::Error::other("connection reset");
        attempts.record(AttemptOutcome::of::<()>(Err(&reset)));
        let again = attempts.admit();
        attempts.record(AttemptOutcome::of::<()>(Err(&reset)));
        std::future::ready(again.map(|()| Response::new(())))
    }));
    svc.clone().oneshot(Request::new(())).await.unwrap();
    let s = b.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (2, 2));
    assert_eq!(s.totals.failed, 2);
    assert_eq!(state(&b), State::Closed);
    // Two more: four failures of four, and the fourth report opens it.
    svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(state(&b), State::Open);
    assert_eq!(b.snapshot().totals.failed, 4);
    let refused: Result<_, BoxError> = svc.oneshot(Request::new(())).await;
    assert!(refused.is_err(), "refused once open");
    assert_eq!(b.snapshot().totals.rejected, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_recent_transitions_keep_the_last_ten_oldest_first() {
    let b = breaker(1);
    let mut expected = Vec::new();
    for _ in 0..4 {
        record(&b, Outcome::Failure, 1);
        advance(secs(60)).await;
        b.try_acquire().expect("the probe").record(Outcome::Success);
        expected.extend([
            (State::Closed, State::Open),
            (State::Open, State::HalfOpen),
            (State::HalfOpen, State::Closed),
        ]);
        let seen: Vec<_> = b
            .recent_transitions()
            .iter()
            .map(|t| (t.from, t.to))
            .collect();
        let kept = expected.len().min(10);
        assert_eq!(seen, expected[expected.len() - kept..]);
    }
}
