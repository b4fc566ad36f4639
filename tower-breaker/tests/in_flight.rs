//! Calls in flight for longer than the slow-call threshold are slow
//! evidence while they hang: a hang opens the circuit in about the
//! threshold, not the deadline, and each call is counted once.

mod support;

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use support::*;
use tokio::time::{timeout, Instant};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, Mode, Outcome, PlainBreakerLayer, State, Transition};

/// Slow at 100 ms, open at half slow; a window of 20, at least 10 calls.
fn slow_breaker() -> Breaker {
    Breaker::with_config(
        "inventory",
        config()
            .count_window(20)
            .minimum_calls(10)
            .slow_calls(ms(100), 0.5),
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_stuck_past_the_threshold_counts_once_before_and_after_it_completes() {
    let breaker = slow_breaker();
    let stuck = breaker.try_acquire().expect("closed");
    advance(ms(99)).await;
    assert_eq!(
        breaker.snapshot().window.slow_in_flight,
        0,
        "99 ms: not yet"
    );
    // Counted at most an eighth of the threshold late.
    advance(ms(1 + 100 / 8)).await;
    let s = breaker.snapshot();
    assert_eq!(s.window.slow_in_flight, 1, "in flight past the threshold");
    assert_eq!(
        (s.window.calls, s.window.slow),
        (0, 0),
        "not in the window yet"
    );
    advance(ms(500)).await;
    assert_eq!(breaker.snapshot().window.slow_in_flight, 1, "still once");

    stuck.record(Outcome::Success);
    let s = breaker.snapshot();
    assert_eq!(s.window.slow_in_flight, 0, "it left the calls in flight");
    assert_eq!(
        (s.window.calls, s.window.slow),
        (1, 1),
        "counted once, as slow"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_that_finishes_just_under_the_threshold_is_never_slow_evidence() {
    let breaker = slow_breaker();
    let quick = breaker.try_acquire().expect("closed");
    advance(ms(99)).await;
    assert_eq!(breaker.snapshot().window.slow_in_flight, 0);
    quick.record(Outcome::Success);
    advance(ms(500)).await;
    let s = breaker.snapshot();
    assert_eq!(s.window.slow_in_flight, 0);
    assert_eq!((s.window.calls, s.window.slow), (1, 0), "a plain success");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cancelled_call_leaves_the_calls_in_flight() {
    let breaker = slow_breaker();
    let dropped = breaker.try_acquire().expect("closed");
    advance(ms(50)).await;
    drop(dropped);
    advance(ms(500)).await;
    assert_eq!(breaker.snapshot().window.slow_in_flight, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hung_calls_open_the_circuit_at_the_next_admission_before_any_of_them_ends() {
    let breaker = slow_breaker();
    // A window full of quick successes: healthy traffic before the hang.
    record(&breaker, Outcome::Success, 20);
    // Ten calls hang; ten of twenty is half the window.
    let hung: Vec<_> = (0..10)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    advance(ms(100 + 100 / 8 + 1)).await;
    assert_eq!(state(&breaker), State::Closed, "nothing judged them yet");
    assert_eq!(breaker.snapshot().window.slow_in_flight, 10);

    // The next call sweeps, finds half the window hung, opens the circuit
    // and is itself refused.
    let refused = breaker
        .try_acquire()
        .expect_err("opened by the calls in flight");
    assert!(refused.retry_after() > ms(0));
    let s = breaker.snapshot();
    assert_eq!(s.state, State::Open);
    assert_eq!(s.totals.rejected, 1);
    // They end later: stale, counted nowhere.
    for permit in hung {
        permit.record(Outcome::Success);
    }
    assert_eq!(breaker.snapshot().totals.stale, 10);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn too_few_hung_calls_do_not_open_the_circuit() {
    let breaker = slow_breaker();
    record(&breaker, Outcome::Success, 20);
    let hung: Vec<_> = (0..9)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    advance(ms(200)).await;
    for _ in 0..5 {
        advance(ms(20)).await;
        let permit = breaker.try_acquire().expect("9 of 20 is under half");
        permit.record(Outcome::Success);
    }
    assert_eq!(breaker.snapshot().window.slow_in_flight, 9);
    assert_eq!(state(&breaker), State::Closed);
    drop(hung);
    assert_eq!(breaker.snapshot().window.slow_in_flight, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn calls_hung_before_the_circuit_last_opened_are_no_evidence_against_the_next_closed_state() {
    let breaker = slow_breaker();
    let hung: Vec<_> = (0..10)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    breaker.set_mode(Mode::ForcedOpen);
    breaker.set_mode(Mode::Automatic);
    advance(ms(500)).await;
    let s = breaker.snapshot();
    assert_eq!(s.state, State::Closed);
    assert_eq!(s.window.slow_in_flight, 0, "another closed state's calls");
    breaker
        .try_acquire()
        .expect("not judged by the old calls")
        .record(Outcome::Success);
    assert_eq!(state(&breaker), State::Closed);
    drop(hung);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_slow_call_detection_nothing_is_tracked() {
    let breaker = Breaker::with_config("plain", config().count_window(20).minimum_calls(10));
    let hung: Vec<_> = (0..20)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    advance(secs(5)).await;
    breaker
        .try_acquire()
        .expect("closed")
        .record(Outcome::Success);
    assert_eq!(breaker.snapshot().window.slow_in_flight, 0);
    assert_eq!(state(&breaker), State::Closed);
    drop(hung);
}

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>> + Send>>;

/// The scenario: slow at 200 ms, a 1 s deadline inside the
/// breaker, 100 calls/s of healthy traffic, then the dependency hangs.
/// Before, the circuit opened when the first deadlines expired, 1.09 s and
/// 110 calls later.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hang_opens_the_circuit_in_about_the_threshold_not_the_deadline() {
    let breaker = Breaker::with_config(
        "catalog",
        config()
            .count_window(20)
            .minimum_calls(10)
            .slow_calls(ms(200), 0.5),
    );
    let hanging = Arc::new(AtomicBool::new(false));
    let reached_while_hanging = Arc::new(AtomicUsize::new(0));
    let dependency = {
        let hanging = hanging.clone();
        let reached = reached_while_hanging.clone();
        service_fn(move |_: ()| {
            let hang = hanging.load(Relaxed);
            if hang {
                reached.fetch_add(1, Relaxed);
            }
            async move {
                if hang {
                    pending::<()>().await;
                }
                tokio::time::sleep(ms(5)).await;
                Ok::<_, BoxError>(())
            }
        })
    };
    // The deadline is inside the breaker: expiry is a failure it counts.
    let deadline = service_fn(move |()| {
        let call = dependency.clone().oneshot(());
        async move {
            let answer: Result<(), BoxError> = match timeout(secs(1), call).await {
                Ok(answer) => answer,
                Err(_) => Err("deadline exceeded".into()),
            };
            answer
        }
    });
    let client = PlainBreakerLayer::new(breaker.clone()).layer(deadline);

    let mut hang_started = None;
    let mut opened_after = None;
    for tick in 0..300u32 {
        if tick == 100 {
            hanging.store(true, Relaxed);
            hang_started = Some(Instant::now());
        }
        let call: BoxFuture = Box::pin(client.clone().oneshot(()));
        tokio::spawn(async move {
            let _ = call.await;
        });
        if opened_after.is_none() && state(&breaker) == State::Open {
            opened_after = Some(hang_started.expect("healthy before").elapsed());
        }
        advance(ms(10)).await;
    }
    let opened_after = opened_after.expect("the hang opened the circuit");
    let reached = reached_while_hanging.load(Relaxed);
    eprintln!("opened {opened_after:?} after the hang started; {reached} calls reached it");
    assert!(
        opened_after <= ms(350),
        "threshold + 150 ms at most, took {opened_after:?}"
    );
    assert!(reached <= 30, "{reached} calls reached the hung dependency");
    let last = breaker.snapshot();
    assert_eq!(last.totals.opened, 1);
    assert!(last.totals.rejected > 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_opening_names_the_slow_call_rate_and_the_evidence() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = {
        let seen = seen.clone();
        move |t: &Transition| seen.lock().unwrap().push((t.to, t.cause, t.window))
    };
    let breaker = Breaker::with_config(
        "t",
        config()
            .count_window(20)
            .minimum_calls(10)
            .slow_calls(ms(100), 0.5)
            .listener(listener),
    );
    let hung: Vec<_> = (0..10)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    advance(ms(150)).await;
    let err: CircuitOpen = breaker.try_acquire().expect_err("opened");
    assert!(err.to_string().contains("is open"), "{err}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (to, cause, window) = seen[0];
    assert_eq!((to, cause), (State::Open, Cause::SlowCallRate));
    assert_eq!(
        (window.calls, window.slow),
        (10, 10),
        "judged on the calls in flight"
    );
    drop(hung);
}

/// Many tasks on two threads start and end calls at once, through every
/// way a call ends: none is left counted in flight, none counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_calls_leave_nothing_in_flight() {
    let breaker = Breaker::with_config(
        "race",
        config()
            .count_window(1_000)
            .failure_rate(1.0)
            .slow_calls(ms(50), 1.0),
    );
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                for i in 0..2_000u32 {
                    let permit = breaker.try_acquire().expect("never opens");
                    if i % 50 == 0 {
                        tokio::task::yield_now().await;
                    }
                    match (task + i) % 3 {
                        0 => permit.record(Outcome::Success),
                        1 => permit.record(Outcome::Failure),
                        _ => drop(permit),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no panic");
    }
    // A call left counted would be past the threshold by now.
    tokio::time::sleep(ms(100)).await;
    let s = breaker.snapshot();
    assert_eq!(s.window.slow_in_flight, 0, "every call left");
    assert_eq!(s.state, State::Closed);
    assert_eq!(
        s.totals.successful + s.totals.failed + s.totals.ignored,
        32_000
    );
}

/// A dependency that sends its head at once and stalls its bodies: with the
/// default `CallEnd::Body`, the stalled bodies are calls in flight and open
/// the circuit; with `CallEnd::Head`, a call stops being timed at its head.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stalled_bodies_are_stuck_calls_unless_timing_ends_at_the_head() {
    use tower_breaker::config::CallEnd;
    use tower_breaker::BreakerLayer;

    for (end, opens) in [(CallEnd::Body, true), (CallEnd::Head, false)] {
        let calls = Arc::new(AtomicUsize::new(0));
        let breaker = Breaker::with_config(
            "bodies",
            config()
                .count_window(20)
                .minimum_calls(10)
                .slow_calls(ms(100), 0.5)
                .slow_call_end(end),
        );
        let client = BreakerLayer::new(breaker.clone())
            .layer(streaming(vec![Step::Data("a"), Step::Stall], &calls));
        let mut bodies = Vec::new();
        for _ in 0..10 {
            let response = client
                .clone()
                .oneshot(http::Request::new(String::new()))
                .await
                .expect("a head");
            bodies.push(response.into_body());
        }
        advance(ms(150)).await;
        let s = breaker.snapshot();
        assert_eq!(
            s.window.slow_in_flight,
            if opens { 10 } else { 0 },
            "{end:?}"
        );
        let next = client
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await;
        assert_eq!(next.is_err(), opens, "{end:?}");
        assert_eq!(state(&breaker) == State::Open, opens, "{end:?}");
        drop(bodies);
        assert_eq!(breaker.snapshot().window.slow_in_flight, 0, "{end:?}");
    }
}
