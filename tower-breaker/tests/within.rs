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

/// A process frozen again and again gets at most three fresh periods.
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
