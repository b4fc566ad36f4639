//! Manual modes, switched at run time on the shared handle.

mod support;

use support::*;
use tower::Layer;
use tower_breaker::{BreakerLayer, Mode, Outcome, State};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn forced_open_rejects_everything_without_calling() {
    let b = breaker(2);
    let calls = CallCounter::default();
    let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, 200));
    b.set_mode(Mode::ForcedOpen);
    for _ in 0..3 {
        let err = send(&svc).await.unwrap_err();
        let open = err
            .downcast_ref::<tower_breaker::error::CircuitOpen>()
            .unwrap();
        assert!(open.is_forced());
        assert_eq!(open.to_string(), "circuit `test` is forced open");
    }
    // Forced open never probes, however long it lasts.
    advance(secs(3600)).await;
    assert!(send(&svc).await.is_err());
    assert_eq!(calls.calls(), 0);
    assert_eq!(b.snapshot().totals.rejected, 4);
    assert_eq!(b.mode(), Mode::ForcedOpen);

    b.set_mode(Mode::Automatic);
    assert!(send(&svc).await.is_ok());
    assert_eq!(calls.calls(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn forced_closed_counts_but_never_opens() {
    let b = breaker(2);
    b.set_mode(Mode::ForcedClosed);
    record(&b, Outcome::Failure, 100);
    let s = b.snapshot();
    assert_eq!(s.state, State::Closed);
    assert_eq!(s.window.failures, 2);
    assert_eq!(s.totals.failed, 100);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn disabled_passes_everything_and_counts_nothing() {
    let b = breaker(2);
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Open);
    b.set_mode(Mode::Disabled);
    record(&b, Outcome::Failure, 100);
    let s = b.snapshot();
    assert_eq!(s.totals.failed, 2);
    assert_eq!(s.window.calls, 0);
    assert_eq!(s.state, State::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn metrics_only_runs_the_machine_but_never_rejects() {
    let seen = Transitions::default();
    let b = tower_breaker::Breaker::with_config(
        "t",
        config()
            .count_window(2)
            .minimum_calls(2)
            .listener(seen.listener()),
    );
    b.set_mode(Mode::MetricsOnly);
    let calls = CallCounter::default();
    let svc = BreakerLayer::new(b.clone()).layer(answering(&calls, 500));
    for _ in 0..10 {
        assert_eq!(send(&svc).await.unwrap().status(), 500);
    }
    assert_eq!(calls.calls(), 10, "nothing was rejected");
    let s = b.snapshot();
    assert_eq!(s.state, State::Open, "but the machine opened");
    assert_eq!(s.mode, Mode::MetricsOnly);
    assert_eq!(s.totals.rejected, 0);
    assert_eq!(s.totals.passed_in_metrics_only, 8);
    assert!(seen.seen().contains(&(State::Closed, State::Open)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn switching_modes_discards_calls_in_flight() {
    let b = breaker(2);
    let p1 = b.try_acquire().unwrap();
    let p2 = b.try_acquire().unwrap();
    b.set_mode(Mode::Automatic);
    p1.record(Outcome::Failure);
    p2.record(Outcome::Failure);
    assert_eq!(state(&b), State::Closed);
    assert_eq!(b.snapshot().totals.stale, 2);
}
