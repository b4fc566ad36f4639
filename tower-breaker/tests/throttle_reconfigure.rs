//! `ThrottleHandle::reconfigure`: new Ks, cap and floor on a running
//! throttle, judged on the window already counted.

use std::time::Duration;

use tower_breaker::throttle::{ThrottleConfig, ThrottleHandle};
use tower_breaker::Outcome;
use tower_resilience_base::criticality::Criticality;

#[tokio::test(start_paused = true)]
async fn a_new_k_judges_the_window_already_counted() {
    let throttle = ThrottleHandle::new("dep");
    // 100 requests, 40 refused: 60 accepts. K = 2: 100 - 120 < 0, nothing
    // rejected.
    for i in 0..100 {
        let permit = throttle
            .try_acquire(Criticality::Critical)
            .expect("no rejection yet");
        permit.record(if i % 5 < 2 {
            Outcome::Failure
        } else {
            Outcome::Success
        });
    }
    let before = throttle.snapshot();
    assert_eq!(before.probabilities[Criticality::Critical.index()], 0.0);

    let not_live = throttle
        .reconfigure(ThrottleConfig::new().k(1.2).max_rejection(0.5))
        .unwrap();
    assert!(not_live.is_empty(), "{not_live:?}");
    let after = throttle.snapshot();
    assert_eq!(
        (after.requests, after.accepts),
        (before.requests, before.accepts),
        "the window is kept"
    );
    // K = 1.2: (100 - 72) / 101, under the new 50% cap.
    let p = after.probabilities[Criticality::Critical.index()];
    assert!((p - 28.0 / 101.0).abs() < 1e-9, "{p}");

    // The refusal budget set with the old K does not hide the new rule:
    // some of the next requests are rejected at once.
    let rejected = (0..200)
        .filter(|_| match throttle.try_acquire(Criticality::Critical) {
            Ok(permit) => {
                permit.record(Outcome::Success);
                false
            }
            Err(_) => true,
        })
        .count();
    assert!(rejected > 0, "the new K rejects");
}

#[test]
fn what_cannot_change_live_is_kept_and_said() {
    let throttle = ThrottleHandle::new("dep");
    let not_live = throttle
        .reconfigure(ThrottleConfig::new().window(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(not_live, ["window"]);
    assert_eq!(throttle.config().get_window(), Duration::from_secs(120));
    let err = throttle
        .reconfigure(ThrottleConfig::new().k(0.5))
        .unwrap_err();
    assert!(err.to_string().contains("K"), "{err}");
    assert_eq!(
        throttle.config().get_k(Criticality::Critical),
        2.0,
        "unchanged"
    );
}
