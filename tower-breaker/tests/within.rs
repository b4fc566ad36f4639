//! `store::within`, the store calls' timeout: a call in flight while the
//! process is frozen is not timed out by the freeze itself.

use std::task::Poll;
use std::time::Duration;

use tokio_test::task;
use tower_breaker::store::within;

const TIMEOUT: Duration = Duration::from_millis(50);

/// Regression: a report in flight when an instance was frozen failed as
/// soon as it was thawed (its timeout had lapsed on the frozen clock), as
/// "maybe applied", and its outcomes were lost.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_timeout_that_lapsed_while_the_process_was_frozen_gives_one_more_period() {
    let (answer, answered) = tokio::sync::oneshot::channel::<u32>();
    let mut call = task::spawn(within(TIMEOUT, answered));
    assert!(call.poll().is_pending());
    // Frozen for 300 ms: the clock moves, nothing runs.
    tokio::time::advance(Duration::from_millis(300)).await;
    assert!(call.is_woken());
    assert!(
        call.poll().is_pending(),
        "thawed: the call gets a fresh period"
    );
    tokio::time::advance(Duration::from_millis(10)).await;
    answer.send(7).unwrap();
    assert_eq!(call.poll(), Poll::Ready(Ok(Ok(7))));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_that_is_only_slow_times_out_after_its_timeout() {
    let started = tokio::time::Instant::now();
    let err = within(TIMEOUT, std::future::pending::<()>())
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), TIMEOUT);
    assert_eq!(err.after(), TIMEOUT);
}

/// A process frozen again and again: three freezes are left out of the
/// call's time, the fourth counts.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn repeated_freezes_extend_a_call_three_times_at_most() {
    let mut call = task::spawn(within(TIMEOUT, std::future::pending::<()>()));
    assert!(call.poll().is_pending());
    for _ in 0..3 {
        tokio::time::advance(Duration::from_millis(300)).await;
        assert!(call.poll().is_pending());
    }
    tokio::time::advance(Duration::from_millis(300)).await;
    assert!(matches!(call.poll(), Poll::Ready(Err(_))));
}

/// A freeze shorter than the timeout, that starts just after the call:
/// the timer fires late by less than the timeout, and the call still gets
/// the rest of its time (it used to time out at once on thawing).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_freeze_shorter_than_the_timeout_is_not_counted_either() {
    let timeout = Duration::from_millis(1_000);
    let (answer, answered) = tokio::sync::oneshot::channel::<u32>();
    let mut call = task::spawn(within(timeout, answered));
    assert!(call.poll().is_pending());
    tokio::time::advance(Duration::from_millis(10)).await;
    // Frozen for 1.2 s, 10 ms in.
    tokio::time::advance(Duration::from_millis(1_200)).await;
    assert!(call.poll().is_pending(), "thawed with 990 ms left");
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(call.poll().is_pending());
    answer.send(7).unwrap();
    assert_eq!(call.poll(), Poll::Ready(Ok(Ok(7))));
}

/// Run time counts in steps: a call that is only slow, under a timeout
/// that is not a multiple of ten milliseconds, times out on time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_steps_add_up_to_the_timeout_exactly() {
    let timeout = Duration::from_millis(333);
    let started = tokio::time::Instant::now();
    within(timeout, std::future::pending::<()>())
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), timeout);
}
