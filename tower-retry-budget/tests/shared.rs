//! A retry budget shared with a fleet (`RetryBudget::share`): each retry
//! is claimed from the fleet during its backoff; a refusal returns the
//! last outcome, an unavailable fleet leaves the decision to the process's
//! own budget, a granted retry that is not sent is given back.

mod support;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{get, status_with, Log, Scripted};
use tower::{Layer, Service, ServiceExt};
use tower_resilience_base::fleet::{Claim, ClaimFuture, SharedRetries};
use tower_retry_budget::{Backoff, GaveUp, RetryBudget, RetryLayer, StopReason};

/// A fleet that answers from a script, after `delay`, and counts.
#[derive(Debug)]
struct Fleet {
    answers: Mutex<Vec<Claim>>,
    delay: Duration,
    claims: AtomicU64,
    given_back: AtomicU64,
}

impl Fleet {
    fn new(answers: &[Claim], delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.iter().rev().copied().collect()),
            delay,
            claims: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
        })
    }
}

impl SharedRetries for Fleet {
    fn claim(&self) -> ClaimFuture {
        self.claims.fetch_add(1, SeqCst);
        let answer = self.answers.lock().unwrap().pop().unwrap_or(Claim::Refused);
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer
        })
    }

    fn give_back(&self) {
        self.given_back.fetch_add(1, SeqCst);
    }
}

fn layer(budget: &Arc<RetryBudget>) -> RetryLayer {
    RetryLayer::new()
        .max_attempts(3)
        .backoff(Backoff::full_jitter(
            Duration::from_millis(20),
            Duration::from_millis(20),
        ))
        .budget(Arc::clone(budget))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_retry_is_claimed_from_the_fleet_and_sent_when_granted() {
    let fleet = Fleet::new(&[Claim::Granted, Claim::Granted], Duration::from_millis(5));
    // A process budget that would refuse every retry: the fleet decides.
    let budget = Arc::new(RetryBudget::new().min_per_sec(0));
    assert!(budget.share(fleet.clone()));
    let log = Log::new();
    let svc = layer(&budget).layer(Scripted::fails_then_ok(&log, 503, 2));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(log.count(), 3);
    assert_eq!(fleet.claims.load(SeqCst), 2);
    let counters = budget.counters();
    assert_eq!((counters.requests, counters.retries), (1, 2));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refusal_returns_the_last_outcome_without_waiting_the_backoff() {
    let fleet = Fleet::new(&[Claim::Refused], Duration::from_millis(1));
    // A process budget with room: the fleet's refusal stands.
    let budget = Arc::new(RetryBudget::new());
    budget.share(fleet.clone());
    let log = Log::new();
    let svc = layer(&budget).layer(Scripted::always(&log, 503));
    let started = tokio::time::Instant::now();
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::Budget
    );
    assert_eq!(log.count(), 1);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(1),
        "the claim's answer, not the 20 ms backoff"
    );
    assert_eq!(budget.counters().refused_by_budget, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_claim_slower_than_the_backoff_delays_the_retry_until_it_answers() {
    let fleet = Fleet::new(&[Claim::Granted], Duration::from_millis(50));
    let budget = Arc::new(RetryBudget::new());
    budget.share(fleet.clone());
    let log = Log::new();
    let svc = layer(&budget).layer(Scripted::fails_then_ok(&log, 503, 1));
    svc.oneshot(get()).await.unwrap();
    let times = log.times();
    assert_eq!(times[1] - times[0], Duration::from_millis(50));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_unavailable_fleet_leaves_the_decision_to_the_process_budget() {
    let log = Log::new();
    // The process's own floor allows it.
    let fleet = Fleet::new(&[Claim::Unavailable], Duration::ZERO);
    let budget = Arc::new(RetryBudget::new());
    budget.share(fleet.clone());
    let svc = layer(&budget).layer(Scripted::fails_then_ok(&log, 503, 1));
    assert_eq!(svc.oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(budget.counters().retries, 1);
    // A process budget with no room refuses it.
    let fleet = Fleet::new(&[Claim::Unavailable], Duration::ZERO);
    let budget = Arc::new(RetryBudget::new().min_per_sec(0));
    budget.share(fleet.clone());
    let svc = layer(&budget).layer(Scripted::always(&log, 503));
    let response = svc.oneshot(get()).await.unwrap();
    assert_eq!(
        response.extensions().get::<GaveUp>().unwrap().reason(),
        StopReason::Budget
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_granted_retry_dropped_during_its_backoff_is_given_back_once() {
    let fleet = Fleet::new(&[Claim::Granted], Duration::from_millis(1));
    let budget = Arc::new(RetryBudget::new());
    budget.share(fleet.clone());
    let log = Log::new();
    // The server asks for a second: the backoff lasts that long.
    let mut svc = layer(&budget).layer(Scripted::new(&log, |_| {
        Ok(status_with(503, "retry-after", "1"))
    }));
    let call = ServiceExt::<http::Request<String>>::ready(&mut svc)
        .await
        .unwrap()
        .call(get());
    // Cut the call 10 ms in: granted at 1 ms, sleeping until 1 s.
    let cut = tokio::time::timeout(Duration::from_millis(10), call).await;
    assert!(cut.is_err());
    assert_eq!(fleet.given_back.load(SeqCst), 1);
    let counters = budget.counters();
    assert_eq!((counters.retries, counters.refunded), (0, 1));
    // A retry that was sent is not given back.
    let fleet = Fleet::new(&[Claim::Granted], Duration::from_millis(1));
    let budget = Arc::new(RetryBudget::new());
    budget.share(fleet.clone());
    let svc = layer(&budget).layer(Scripted::fails_then_ok(&log, 503, usize::MAX));
    let _ = svc.oneshot(get()).await;
    assert_eq!(fleet.given_back.load(SeqCst), 0);
}

#[test]
fn the_response_future_stays_send_and_sync_with_a_claim_in_it() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let budget = Arc::new(RetryBudget::new());
    let log = Log::new();
    let mut svc = layer(&budget).layer(Scripted::always(&log, 503));
    let future = svc.call(get());
    send_sync(&future);
}
