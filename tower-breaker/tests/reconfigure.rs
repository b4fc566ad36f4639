//! `Breaker::reconfigure`: new thresholds on a running breaker, its window
//! and state kept, what cannot change live reported, and no judgement ever
//! made on a mix of two configurations.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tower_breaker::{Breaker, BreakerConfig, Outcome, State};

fn record(breaker: &Breaker, outcome: Outcome, n: usize) {
    for _ in 0..n {
        breaker.try_acquire().expect("closed").record(outcome);
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_stays_open_and_keeps_its_counters() {
    let breaker = Breaker::with_config(
        "dep",
        BreakerConfig::new().open_period(Duration::from_secs(5)),
    );
    record(&breaker, Outcome::Failure, 10);
    let before = breaker.snapshot();
    assert_eq!(before.state, State::Open);

    let done = breaker.reconfigure(
        breaker
            .config()
            .failure_rate(0.9)
            .open_period(Duration::from_secs(30)),
    );
    assert_eq!(done.applied, ["failure_rate", "open_period"]);
    assert!(done.is_complete());

    let after = breaker.snapshot();
    assert_eq!(after.state, State::Open, "the open circuit is not reset");
    assert_eq!(after.totals, before.totals, "the counters are kept");
    assert_eq!(after.totals.opened, 1);
    // The running open period keeps the end it was given (5 s)...
    tokio::time::advance(Duration::from_millis(5_600)).await;
    let probe = breaker
        .try_acquire()
        .expect("the old period ended: a probe");
    probe.record(Outcome::Failure);
    // ...and the next opening uses the new one (30 s, ±10% jitter, grown).
    tokio::time::advance(Duration::from_secs(26)).await;
    assert!(
        breaker.try_acquire().is_err(),
        "re-opened with the new period"
    );
    assert_eq!(breaker.config().get_open_period(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_new_threshold_judges_the_window_already_counted() {
    let breaker = Breaker::with_config("dep", BreakerConfig::new().count_window(20));
    // 4 failures in 10 calls: 40%, under the default 50%.
    record(&breaker, Outcome::Success, 6);
    record(&breaker, Outcome::Failure, 4);
    assert_eq!(breaker.snapshot().state, State::Closed);
    breaker.reconfigure(breaker.config().failure_rate(0.3));
    assert_eq!(breaker.snapshot().window.calls, 10, "the window is kept");
    // The next failure is judged by 30%: 5 in 11 opens.
    record(&breaker, Outcome::Failure, 1);
    assert_eq!(breaker.snapshot().state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn what_cannot_change_live_is_reported_and_kept() {
    let breaker = Breaker::with_config("dep", BreakerConfig::new().count_window(20));
    let done = breaker.reconfigure(
        BreakerConfig::new()
            .time_window(10, Duration::from_secs(1))
            .slow_calls(Duration::from_millis(100), 0.5)
            .minimum_calls(4),
    );
    let not_live: Vec<_> = done.not_live.iter().map(|n| n.setting).collect();
    assert_eq!(not_live, ["window", "slow_calls"]);
    assert_eq!(done.applied, ["minimum_calls"]);
    assert!(done.not_live.iter().all(|n| !n.reason.is_empty()));
    let config = breaker.config();
    assert_eq!(config.get_minimum_calls(), 4);
    assert_eq!(config.get_slow_call_duration(), None, "still off");
    // Still the count window of 20: 4 failures of 4 open it.
    record(&breaker, Outcome::Failure, 4);
    assert_eq!(breaker.snapshot().state, State::Open);
}

/// The clock is live: a running breaker switched to the coarse clock
/// tells time by it (which does not follow tokio's paused clock, so its
/// open period outlasts a paused minute), and switched back it reads
/// tokio's clock again (whose minute has ended the period).
#[tokio::test(start_paused = true)]
async fn the_clock_switches_on_a_running_breaker() {
    let config = BreakerConfig::new()
        .count_window(4)
        .minimum_calls(4)
        .open_period(Duration::from_secs(30));
    let breaker = Breaker::with_config("dep", config);
    let done = breaker.reconfigure(breaker.config().coarse_clock(true));
    if !breaker.config().get_coarse_clock() {
        // No coarse clock on this machine (its thread could not start).
        return;
    }
    assert_eq!(done.applied, ["coarse_clock"]);
    assert!(done.not_live.is_empty(), "{done:?}");
    record(&breaker, Outcome::Failure, 4);
    assert_eq!(breaker.snapshot().state, State::Open);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(
        breaker.try_acquire().is_err(),
        "on the coarse clock, a paused minute is no time at all"
    );
    let done = breaker.reconfigure(breaker.config().coarse_clock(false));
    assert_eq!(done.applied, ["coarse_clock"]);
    assert!(!breaker.config().get_coarse_clock());
    let probe = breaker
        .try_acquire()
        .expect("on tokio's clock the open period is over");
    assert!(probe.is_probe());
}

#[tokio::test(start_paused = true)]
async fn the_same_configuration_changes_nothing() {
    let breaker = Breaker::new("dep");
    let done = breaker.reconfigure(breaker.config());
    assert!(
        done.applied.is_empty() && done.not_live.is_empty(),
        "{done:?}"
    );
}

/// Two configurations that each keep the circuit closed under 50%
/// failures: A opens only at 100% failures, B only after 10 million calls
/// at 1%. A judgement made on A's minimum and B's rate would open it.
#[test]
fn racing_reconfigurations_never_judge_on_a_torn_configuration() {
    let a = BreakerConfig::new()
        .time_window(10, Duration::from_secs(1))
        .minimum_calls(10)
        .failure_rate(1.0);
    let b = a.clone().minimum_calls(10_000_000).failure_rate(0.01);
    let breaker = Breaker::with_config("dep", a.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut callers = Vec::new();
        for task in 0..8 {
            let breaker = breaker.clone();
            let stop = Arc::clone(&stop);
            callers.push(tokio::spawn(async move {
                let mut i = task;
                while !stop.load(Relaxed) {
                    let permit = breaker.try_acquire().expect("never opens");
                    permit.record(if i % 2 == 0 {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    });
                    i += 1;
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        let reloader = {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                for round in 0..20_000 {
                    breaker.reconfigure(if round % 2 == 0 { b.clone() } else { a.clone() });
                    if round % 16 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        reloader.await.unwrap();
        stop.store(true, Relaxed);
        for caller in callers {
            caller.await.unwrap();
        }
    });
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(snapshot.totals.opened, 0);
    assert!(
        snapshot.totals.failed > 1_000,
        "the callers ran: {:?}",
        snapshot.totals
    );
}
