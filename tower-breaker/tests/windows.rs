//! The windows slide: old outcomes leave, and the minimum number of calls
//! is honoured whatever the window's size.

mod support;

use support::*;
use tower_breaker::{Breaker, Outcome, State};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn after_10000_successes_failures_open_at_the_threshold_share_of_the_window() {
    // Window 100, 50%: once the window is full of successes, 50 failures
    // make half of it.
    let b = Breaker::with_config("t", config().count_window(100).minimum_calls(10));
    record(&b, Outcome::Success, 10_000);
    record(&b, Outcome::Failure, 49);
    assert_eq!(state(&b), State::Closed, "49 of the last 100");
    record(&b, Outcome::Failure, 1);
    assert_eq!(
        state(&b),
        State::Open,
        "50 of the last 100, not 10,000 failures"
    );
    let s = b.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (100, 50));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn minimum_calls_is_independent_of_the_window_size() {
    for size in [20, 100, 1000] {
        let b = Breaker::with_config("t", config().count_window(size).minimum_calls(10));
        record(&b, Outcome::Failure, 9);
        assert_eq!(state(&b), State::Closed, "window {size}: 9 < minimum");
        record(&b, Outcome::Failure, 1);
        assert_eq!(state(&b), State::Open, "window {size}: at the minimum");
    }
    // A minimum above the window's size is capped at the size.
    let b = Breaker::with_config("t", config().count_window(5).minimum_calls(50));
    record(&b, Outcome::Failure, 5);
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn successes_never_open_and_the_window_forgets_failures() {
    let b = Breaker::with_config("t", config().count_window(10).minimum_calls(10));
    record(&b, Outcome::Failure, 4);
    record(&b, Outcome::Success, 6);
    record(&b, Outcome::Success, 4); // the four failures slide out
    let s = b.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (10, 0));
    record(&b, Outcome::Failure, 4);
    assert_eq!(state(&b), State::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ignored_outcomes_are_not_counted() {
    let b = breaker(4);
    record(&b, Outcome::Ignored, 100);
    let s = b.snapshot();
    assert_eq!(s.window.calls, 0);
    assert_eq!(s.totals.ignored, 100);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn time_window_slides_bucket_by_bucket() {
    let b = Breaker::with_config("t", config().time_window(10, secs(1)).minimum_calls(10));
    record(&b, Outcome::Success, 10_000);
    advance(secs(9)).await;
    assert_eq!(b.snapshot().window.calls, 10_000);
    // Ten seconds later the successes have left the window...
    advance(secs(1)).await;
    assert_eq!(b.snapshot().window.calls, 0);
    // ...so ten failures open it.
    record(&b, Outcome::Failure, 9);
    assert_eq!(state(&b), State::Closed, "9 calls, below the minimum");
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn time_window_counts_the_last_n_buckets_only() {
    let b = Breaker::with_config("t", config().time_window(3, secs(1)).minimum_calls(4));
    record(&b, Outcome::Failure, 3);
    advance(secs(1)).await;
    record(&b, Outcome::Success, 3);
    assert_eq!(b.snapshot().window.calls, 6);
    advance(secs(2)).await;
    // The failures' bucket (tick 0) left the 3-bucket window at tick 3.
    let s = b.snapshot();
    assert_eq!((s.window.calls, s.window.failures), (3, 0));
    record(&b, Outcome::Failure, 2);
    assert_eq!(state(&b), State::Closed, "2 of 5");
    record(&b, Outcome::Failure, 1);
    assert_eq!(state(&b), State::Open, "3 of 6");

    // Minimum calls in a time window: 3 failures in 3 buckets stay below 4.
    let b = Breaker::with_config("t", config().time_window(3, secs(1)).minimum_calls(4));
    for _ in 0..6 {
        record(&b, Outcome::Failure, 1);
        advance(secs(1)).await;
    }
    assert_eq!(
        state(&b),
        State::Closed,
        "never more than 3 calls in the window"
    );
}
