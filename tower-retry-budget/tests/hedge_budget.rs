//! Hedges and the retry budget: refused when it is spent, within its share
//! when every call is slow (the dependency is saturated), stopped when the
//! breaker opens, never more than the share when threads race, and, with a
//! retry layer below, hedges plus retries within one share.

mod hedge_support;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hedge_support::{get, Replicas, Reply, MS};
use http::Request;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_resilience_base::hook::Attempts;
use tower_resilience_base::CallContext;
use tower_retry_budget::hedge::{HedgeLayer, HEDGE_ATTEMPT_HEADER};
use tower_retry_budget::{
    AttemptHook, AttemptOutcome, AttemptToken, BoxError, RetryBudget, RetryLayer, SeededRandom,
};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_spent_budget_refuses_the_hedge() {
    let budget = Arc::new(RetryBudget::new().ratio(0.0).min_per_sec(0));
    let layer = HedgeLayer::new()
        .fixed_delay(20 * MS)
        .budget(budget.clone());
    let replicas = Replicas::first_slow(100 * MS, 5 * MS);
    let start = Instant::now();
    let response = layer.layer(replicas.clone()).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 100 * MS, "the first attempt's answer");
    assert_eq!(replicas.count(), 1);
    assert_eq!(layer.counters().refused_by_budget, 1);
    let counters = budget.counters();
    assert_eq!((counters.requests, counters.refused_by_budget), (1, 1));
}

/// A breaker model that opens when at least half of the last 20 attempts
/// took 100 ms or more: slowness, not errors, is the failure.
#[derive(Debug)]
struct SlowCallBreaker {
    origin: Instant,
    last: Mutex<VecDeque<bool>>,
    open: AtomicBool,
    opened_at: AtomicU64,
}

#[derive(Debug)]
struct Open;

impl std::fmt::Display for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("circuit open")
    }
}

impl std::error::Error for Open {}

impl SlowCallBreaker {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last: Mutex::default(),
            open: AtomicBool::new(false),
            opened_at: AtomicU64::new(u64::MAX),
        })
    }

    fn nanos(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn is_open(&self) -> bool {
        self.open.load(SeqCst)
    }

    fn opened_at(&self) -> Option<Instant> {
        let at = self.opened_at.load(SeqCst);
        (at != u64::MAX).then(|| self.origin + Duration::from_nanos(at))
    }
}

impl AttemptHook for SlowCallBreaker {
    fn admit(&self) -> Result<AttemptToken, BoxError> {
        if self.is_open() {
            return Err(Open.into());
        }
        Ok(AttemptToken::new(1, self.nanos()))
    }

    fn check(&self) -> Result<(), BoxError> {
        if self.is_open() {
            return Err(Open.into());
        }
        Ok(())
    }

    fn record(&self, token: AttemptToken, _outcome: AttemptOutcome<'_>) {
        let slow = self.nanos() - token.parts().1 >= 100_000_000;
        let mut last = self.last.lock().unwrap();
        last.push_back(slow);
        if last.len() > 20 {
            last.pop_front();
        }
        let slow_calls = last.iter().filter(|s| **s).count();
        if last.len() == 20 && slow_calls * 2 >= 20 && !self.open.swap(true, SeqCst) {
            self.opened_at.store(self.nanos(), SeqCst);
        }
    }

    fn cancel(&self, _token: AttemptToken) {}
}

/// Open-loop load through `svc` at `per_sec` for `n` requests; with a
/// breaker, a request it refuses is not sent (it fails fast above).
/// Returns how many the breaker refused.
async fn load<S>(
    mut svc: S,
    n: usize,
    per_sec: u64,
    breaker: Option<&Arc<SlowCallBreaker>>,
) -> usize
where
    S: Service<Request<String>, Response = http::Response<String>, Error = BoxError>,
    S::Future: Send + 'static,
{
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
    let mut tasks = Vec::new();
    let mut refused = 0;
    for _ in 0..n {
        tick.tick().await;
        svc.ready().await.unwrap();
        let future = match breaker {
            Some(breaker) => {
                let Ok(token) = breaker.admit() else {
                    refused += 1;
                    continue;
                };
                let attempts = Attempts::new(breaker.clone(), token);
                CallContext::offer_attempts(attempts, || svc.call(get())).0
            }
            None => svc.call(get()),
        };
        tasks.push(tokio::spawn(future));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    refused
}

/// Healthy at 5 ms for 5 s, then saturated: every call takes 300 ms.
fn saturating(healthy_calls: usize) -> Replicas {
    Replicas::new(move |n| {
        let latency = if n < healthy_calls { 5 * MS } else { 300 * MS };
        (latency, Reply::Status(200))
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn when_every_call_is_slow_hedges_stay_within_the_budget() {
    // 200 requests a second: 1,000 healthy, then 4,000 saturated. A fixed
    // 20 ms delay (the worst case: nothing learned) makes every saturated
    // call want a hedge.
    let (rate, healthy, saturated) = (200, 1_000, 4_000);
    let requests = healthy + saturated;
    let dependency = saturating(healthy);
    let layer = HedgeLayer::new().fixed_delay(20 * MS);
    load(layer.layer(dependency.clone()), requests, rate, None).await;
    let extra = dependency.count() - requests;
    let c = layer.counters();
    println!(
        "fixed delay, budgeted: {extra} extra calls for {requests} requests ({:.1}%), {c:?}",
        100.0 * extra as f64 / requests as f64,
    );
    assert!(c.refused_by_budget > 0, "the budget is what stopped them");
    assert!(
        extra <= requests / 10 + 50,
        "10% of the requests, plus a window's floor at most: {extra}"
    );

    // Without a budget, the same load doubles the saturated calls.
    let dependency = saturating(healthy);
    let unbudgeted = HedgeLayer::new().fixed_delay(20 * MS).no_budget();
    load(unbudgeted.layer(dependency.clone()), requests, rate, None).await;
    let unbudgeted_extra = dependency.count() - requests;
    println!("fixed delay, no budget: {unbudgeted_extra} extra calls");
    assert!(unbudgeted_extra >= saturated);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_learned_delay_backs_off_by_itself_when_every_call_is_slow() {
    // The same load with the learned delay: the saturated attempts that
    // are cancelled count as at least their elapsed time, so the estimate
    // soon says "beyond anything answered", the delay goes to its maximum
    // (1 s, more than the 300 ms calls take), and then settles just above
    // the calls' new latency: hedging stops by itself within a fraction of
    // a second (the budget caps that transition).
    let (rate, healthy, saturated) = (200, 1_000, 4_000);
    let requests = healthy + saturated;
    let dependency = saturating(healthy);
    let layer = HedgeLayer::new();
    load(layer.layer(dependency.clone()), requests, rate, None).await;
    let extra = dependency.count() - requests;
    let c = layer.counters();
    println!(
        "learned delay: {extra} extra calls for {requests} requests ({:.1}%), delay now {:?}, {c:?}",
        100.0 * extra as f64 / requests as f64,
        layer.current_delay()
    );
    assert!(extra <= requests / 20, "{extra}");
    assert!(layer.current_delay().unwrap() > 300 * MS);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hedges_stop_when_the_breaker_opens_on_slow_calls() {
    let (rate, healthy, saturated) = (200, 1_000, 2_000);
    let dependency = saturating(healthy);
    let breaker = SlowCallBreaker::new();
    let layer = HedgeLayer::new();
    let refused = load(
        layer.layer(dependency.clone()),
        healthy + saturated,
        rate,
        Some(&breaker),
    )
    .await;
    let opened_at = breaker.opened_at().expect("the breaker opened");
    let hedges_after = dependency
        .calls()
        .iter()
        .filter(|c| c.headers.contains_key(HEDGE_ATTEMPT_HEADER) && c.at > opened_at)
        .count();
    let c = layer.counters();
    println!(
        "breaker opened after {:?}; {} hedges before, {hedges_after} after; {refused} calls refused; {:?}",
        opened_at - breaker.origin,
        c.hedges,
        c
    );
    assert_eq!(hedges_after, 0, "no hedge once the circuit is open");
    assert!(c.hedges > 0);
    assert!(refused > 0);
}

#[test]
fn racing_threads_never_hedge_more_than_the_share() {
    // One layer, eight threads each with its own paused runtime, every
    // call hanging: every request wants a hedge at once.
    let budget = Arc::new(RetryBudget::new().ratio(0.1).min_per_sec(0));
    let layer = HedgeLayer::new()
        .fixed_delay(Duration::ZERO)
        .budget(budget.clone());
    let dependency = Replicas::new(|_| (Duration::ZERO, Reply::Hang));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let svc = layer.layer(dependency.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .start_paused(true)
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    for _ in 0..500 {
                        let call = svc.clone().oneshot(get());
                        // Long enough for the hedge to go out, then the
                        // caller gives up.
                        let _ = tokio::time::timeout(5 * MS, call).await;
                    }
                });
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let requests = 8 * 500;
    let hedges = dependency.count() - requests;
    let c = layer.counters();
    assert_eq!(c.requests, requests as u64);
    assert_eq!(c.hedges, hedges as u64);
    assert_eq!(
        c.hedges + c.refused_by_budget,
        requests as u64,
        "each wanted one"
    );
    assert!(
        hedges <= requests / 10,
        "{hedges} hedges for {requests} requests"
    );
    assert!(hedges >= requests / 10 - 8, "the share is used: {hedges}");
    assert_eq!(dependency.in_flight(), 0);
    assert_eq!(dependency.cancelled(), dependency.count());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn with_a_retry_layer_below_hedges_plus_retries_stay_within_one_share() {
    // Every attempt is slow (a hedge each), and every fifth call fails
    // with a 503 (a retry each), for 100 seconds.
    let dependency = Replicas::new(|n| {
        let reply = if n % 5 == 4 {
            Reply::Status(503)
        } else {
            Reply::Status(200)
        };
        (50 * MS, reply)
    });
    let retry = RetryLayer::new()
        .budget(Arc::new(RetryBudget::new().ratio(0.1).min_per_sec(0)))
        .random(SeededRandom::new(3));
    let hedge = HedgeLayer::above(&retry).fixed_delay(20 * MS);
    let svc = ServiceBuilder::new()
        .layer(hedge.clone())
        .layer(retry.clone())
        .service(dependency.clone());
    let requests = 10_000;
    let mut tick = tokio::time::interval(10 * MS);
    let mut tasks = Vec::new();
    for _ in 0..requests {
        tick.tick().await;
        tasks.push(tokio::spawn(svc.clone().oneshot(get())));
    }
    for task in tasks {
        let _ = task.await.unwrap();
    }
    let extra = dependency.count() - requests;
    let hedges = hedge.counters().hedges as usize;
    let retries = extra - hedges;
    println!(
        "{hedges} hedges + {retries} retries = {extra} extra calls for {requests} requests; budget {:?}",
        retry.counters()
    );
    assert!(hedges > 0 && retries > 0, "both drew on the budget");
    assert!(
        extra <= requests / 10 + 10,
        "within 10% of the callers' requests (a bucket's worth of slack): {extra}"
    );
}
