//! A fleet whose instances are each invoked rarely (Lambda environments,
//! one call an invocation, a flush after it): the fleet's count window
//! must place a report's healthy calls when they were made, not spread
//! over the time since the instance's previous report.

use std::sync::Arc;
use std::time::Duration;

use tower_breaker::store::{Decision, MemoryStore, Store};
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome, State};

/// 41 instances on `store`: a count window of 20, judged from 10 calls,
/// open at 50%.
fn instances(store: &Arc<MemoryStore>) -> Vec<Breaker> {
    (0..41)
        .map(|_| {
            let config = BreakerConfig::new()
                .count_window(20)
                .minimum_calls(10)
                .failure_rate(0.5)
                .fleet(FleetConfig::new(store.clone()));
            Breaker::with_config("dependency", config)
        })
        .collect()
}

/// 41 instances, one invocation every 250 ms in turn (each instance about
/// every 10 s), every fourth call failing: 25% of the fleet's calls and of
/// each instance's, below the rule's 50%.
#[tokio::test(start_paused = true)]
async fn a_quarter_failing_across_rarely_invoked_instances_does_not_open_the_fleet() {
    let store = Arc::new(MemoryStore::new());
    let fleet = instances(&store);
    for call in 0..400_u32 {
        let breaker = &fleet[call as usize % fleet.len()];
        let permit = breaker
            .try_acquire()
            .unwrap_or_else(|e| panic!("call {call} rejected: {e}"));
        tokio::time::advance(Duration::from_millis(5)).await;
        permit.record(if call % 4 == 3 {
            Outcome::Failure
        } else {
            Outcome::Success
        });
        breaker.flush().await.unwrap();
        assert!(
            !matches!(
                store.read("dependency").await.unwrap(),
                Decision::Open { .. }
            ),
            "the fleet opened at call {call}, with a quarter failing"
        );
        tokio::time::advance(Duration::from_millis(245)).await;
    }
    assert!(fleet.iter().all(|b| b.snapshot().state == State::Closed));
}

/// The same fleet when half the calls fail: it opens (the test above can
/// fail).
#[tokio::test(start_paused = true)]
async fn half_failing_across_rarely_invoked_instances_opens_the_fleet() {
    let store = Arc::new(MemoryStore::new());
    let fleet = instances(&store);
    let mut opened = None;
    for call in 0..80_u32 {
        let breaker = &fleet[call as usize % fleet.len()];
        let Ok(permit) = breaker.try_acquire() else {
            break;
        };
        tokio::time::advance(Duration::from_millis(5)).await;
        permit.record(if call % 2 == 1 {
            Outcome::Failure
        } else {
            Outcome::Success
        });
        breaker.flush().await.unwrap();
        if matches!(
            store.read("dependency").await.unwrap(),
            Decision::Open { .. }
        ) {
            opened = Some(call);
            break;
        }
        tokio::time::advance(Duration::from_millis(245)).await;
    }
    let opened = opened.expect("half failing opens the fleet");
    assert!(opened < 41, "opened after {opened} calls");
}
