//! The fleet shares its evidence: each breaker reports the outcomes it
//! counted to the store, and the store's window opens the circuit for the
//! whole fleet once the fleet's calls break the rule, even when no process
//! sees enough calls to trip on its own.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use tower_breaker::store::{Decision, FleetRule, MemoryStore, Report, Store};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome, State};

/// Lets spawned store tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn process(store: &Arc<MemoryStore>, fleet_window: bool) -> Breaker {
    Breaker::with_config(
        "payments",
        BreakerConfig::new()
            .jitter(0.0)
            .fleet(FleetConfig::new(store.clone()).fleet_window(fleet_window)),
    )
}

/// 20 processes, each calling a failing dependency once a second (spread
/// over the second): how many calls reach it before every process rejects.
async fn calls_to_open(fleet_window: bool, limit: Duration) -> Option<usize> {
    let store = Arc::new(MemoryStore::new());
    let fleet: Vec<Breaker> = (0..20).map(|_| process(&store, fleet_window)).collect();
    let start = tokio::time::Instant::now();
    let mut calls = 0;
    loop {
        for b in &fleet {
            if let Ok(permit) = b.try_acquire() {
                calls += 1;
                permit.record(Outcome::Failure);
            }
            settle().await;
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        if fleet.iter().all(|b| b.snapshot().state == State::Open) {
            return Some(calls);
        }
        if start.elapsed() > limit {
            return None;
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fleet_of_slow_callers_opens_together_from_the_fleets_evidence() {
    // Each process sees 1 call a second: alone, none reaches the minimum
    // of 10 calls in its window before a minute has passed.
    let alone = calls_to_open(false, Duration::from_secs(5)).await;
    assert_eq!(
        alone, None,
        "without the fleet's window nobody trips in 5 s"
    );
    let together = calls_to_open(true, Duration::from_secs(5))
        .await
        .expect("the fleet opens");
    println!(
        "fleet window: 20 processes x 1 call/s open together after {together} calls (minimum 10)"
    );
    assert!(together <= 2 * 10 + 20, "{together} calls");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_store_opens_when_the_fleets_window_breaks_the_rule() {
    let store = MemoryStore::new();
    let rule = FleetRule::new(10, secs(1), secs(5)).with_minimum_calls(10);
    let report = |calls, failures| Report::new(calls, failures, 0);
    // 9 calls, all failures: below the minimum.
    assert_eq!(
        store.report("x", report(9, 9), rule).await.unwrap(),
        Decision::Missing
    );
    // The 10th call, 5 failures of 10 in all... still 9 + 1 = 10 calls with 9
    // failures: opens.
    assert_eq!(
        store.report("x", report(1, 0), rule).await.unwrap(),
        Decision::Open { remaining: secs(5) }
    );
    // While open, reports are not counted.
    tokio::time::advance(secs(5)).await;
    assert_eq!(
        store.report("x", report(100, 100), rule).await.unwrap(),
        Decision::Expired
    );
    // Buckets older than the window are forgotten.
    let store = MemoryStore::new();
    store.report("y", report(9, 9), rule).await.unwrap();
    tokio::time::advance(secs(10)).await;
    assert_eq!(
        store.report("y", report(1, 1), rule).await.unwrap(),
        Decision::Missing,
        "the first 9 failures left the window"
    );
    // Healthy traffic never opens.
    let store = MemoryStore::new();
    for _ in 0..100 {
        assert_eq!(
            store.report("z", report(10, 4), rule).await.unwrap(),
            Decision::Missing
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_closed_path_sends_at_most_one_report_per_flush_interval() {
    let store = Arc::new(CountingStore::default());
    let b = Breaker::with_config(
        "busy",
        BreakerConfig::new()
            .fleet(FleetConfig::new(store.clone()).flush_interval(ms(100)))
            .count_window(1000)
            .minimum_calls(1000),
    );
    // 10 s of traffic at 1000 calls/s, 10% failures.
    for i in 0..10_000u32 {
        let p = b.try_acquire().unwrap();
        p.record(if i % 10 == 0 {
            Outcome::Failure
        } else {
            Outcome::Success
        });
        if i % 100 == 0 {
            settle().await;
        }
        tokio::time::advance(ms(1)).await;
    }
    // The outcomes since the last report go with the next sync: the first
    // call after the refresh interval (here dropped, so not counted).
    tokio::time::advance(secs(1)).await;
    drop(b.try_acquire());
    settle().await;
    let (reports, reads) = store.counts();
    println!(
        "store cost: {reports} reports and {reads} reads in 10 s at 1000 calls/s with failures"
    );
    assert!(reports + reads <= 10 * 10 + 2, "{reports} + {reads}");
    assert!(
        reports >= 90,
        "failures are reported every interval: {reports}"
    );
    assert_eq!(store.reported(), 10_000, "every outcome reported once");
}

/// A MemoryStore that counts its calls and the outcomes reported to it,
/// and can refuse its next reports.
#[derive(Debug, Default)]
struct CountingStore {
    inner: MemoryStore,
    reports: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
    calls: std::sync::atomic::AtomicU64,
    failures: std::sync::atomic::AtomicU64,
    /// Reports still to refuse, and whether with an error known not to
    /// have been applied.
    refusals: std::sync::atomic::AtomicU32,
    refused_not_applied: std::sync::atomic::AtomicBool,
}

impl CountingStore {
    fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.reports.load(SeqCst), self.reads.load(SeqCst))
    }
    fn reported(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn refuse_reports(&self, n: u32, not_applied: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        self.refused_not_applied.store(not_applied, SeqCst);
        self.refusals.store(n, SeqCst);
    }
}

impl Store for CountingStore {
    fn try_open<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
    ) -> tower_breaker::store::StoreFuture<'a, Duration> {
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> tower_breaker::store::StoreFuture<'a, tower_breaker::store::Election> {
        self.inner.try_acquire_probe(name, open_for, lease)
    }
    fn close<'a>(
        &'a self,
        name: &'a str,
        token: tower_breaker::store::ProbeToken,
    ) -> tower_breaker::store::StoreFuture<'a, bool> {
        self.inner.close(name, token)
    }
    fn read<'a>(&'a self, name: &'a str) -> tower_breaker::store::StoreFuture<'a, Decision> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.read(name)
    }
    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> tower_breaker::store::StoreFuture<'a, Decision> {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .refusals
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let error = tower_breaker::store::StoreError::new("refused");
            let error = if self.refused_not_applied.load(SeqCst) {
                error.not_applied()
            } else {
                error
            };
            return Box::pin(async move { Err(error) });
        }
        self.reports
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.calls
            .fetch_add(report.calls, std::sync::atomic::Ordering::SeqCst);
        self.failures
            .fetch_add(report.failures, std::sync::atomic::Ordering::SeqCst);
        self.inner.report(name, report, rule)
    }
}

/// Many threads record outcomes while reports race (a flush for the
/// failures and the periodic refresh, each from any thread): once the last
/// report is in, the store has been told every call exactly once, never a
/// share twice, and never failures without their calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_reports_tell_the_store_every_call_exactly_once() {
    // One round in about a hundred raced before the fix: five rounds.
    for _ in 0..5 {
        race_reports().await;
    }
}

async fn race_reports() {
    const TASKS: usize = 8;
    const CALLS: usize = 4_000;
    let store = Arc::new(CountingStore::default());
    let breaker = Breaker::with_config(
        "payments",
        BreakerConfig::new()
            .count_window(1_000)
            .minimum_calls(1_000)
            .failure_rate(1.0)
            .fleet(
                FleetConfig::new(store.clone())
                    .refresh_interval(Duration::from_millis(1))
                    .flush_interval(Duration::from_millis(1)),
            ),
    );
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let b = breaker.clone();
            tokio::spawn(async move {
                for i in 0..CALLS {
                    let outcome = if (i + t) % 10 == 0 {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    b.try_acquire().expect("never opens").record(outcome);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // The last outcomes go with the next report.
    let made = breaker.snapshot().totals.calls();
    assert_eq!(made, (TASKS * CALLS) as u64);
    let start = tokio::time::Instant::now();
    while store.reported() < made && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(breaker.try_acquire());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.reported(), made, "every call reported exactly once");
    let failures = store.failures.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(failures, breaker.snapshot().totals.failed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_report_known_not_applied_goes_again_and_an_uncertain_one_does_not() {
    for known_not_applied in [true, false] {
        let store = Arc::new(CountingStore::default());
        store.refuse_reports(3, known_not_applied);
        let b = Breaker::with_config(
            "payments",
            BreakerConfig::new()
                .count_window(1_000)
                .minimum_calls(1_000)
                .fleet(FleetConfig::new(store.clone()).flush_interval(ms(100))),
        );
        // Five rounds of 10 calls (one failure each), a report after each.
        for _ in 0..5 {
            for i in 0..10 {
                let outcome = if i == 0 {
                    Outcome::Failure
                } else {
                    Outcome::Success
                };
                b.try_acquire().unwrap().record(outcome);
            }
            settle().await;
            tokio::time::advance(ms(100)).await;
        }
        b.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        let told = store.reported();
        if known_not_applied {
            assert_eq!(
                told, 51,
                "the refused reports went again with the next ones"
            );
        } else {
            assert!(
                told < 51,
                "a report that may have been applied is not sent twice: {told}"
            );
        }
    }
}

/// 20 processes with the default settings (a count window of 20), each
/// calling every `every_ms` (spread over the interval): healthy for 3 s,
/// then failing. Returns the dependency's calls from the outage until
/// every process rejects.
async fn calls_after_healthy_traffic(every_ms: u64) -> usize {
    let store = Arc::new(MemoryStore::new());
    let fleet: Vec<Breaker> = (0..20).map(|_| process(&store, true)).collect();
    let outage_ms = 3_000;
    let mut failing_calls = 0;
    for t in 0..outage_ms + 60_000 {
        for (i, b) in fleet.iter().enumerate() {
            if t % every_ms != (i as u64 * every_ms / 20) % every_ms {
                continue;
            }
            if let Ok(permit) = b.try_acquire() {
                if t >= outage_ms {
                    failing_calls += 1;
                    permit.record(Outcome::Failure);
                } else {
                    permit.record(Outcome::Success);
                }
            }
        }
        settle().await;
        if t >= outage_ms && fleet.iter().all(|b| b.snapshot().state == State::Open) {
            return failing_calls;
        }
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    panic!("the fleet never opened");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn healthy_history_does_not_dilute_the_fleets_evidence_at_fifty_calls_a_second() {
    // Each process alone trips after 10 failures in its window of 20:
    // 200 calls in all. The fleet's count window judges its newest 20
    // calls, the failures after every process's healthy calls.
    let calls = calls_after_healthy_traffic(20).await;
    println!("fleet count window: 20 processes x 50 calls/s after 3 s healthy: {calls} calls until all reject");
    assert!(calls <= 30, "{calls} calls");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn healthy_history_does_not_dilute_the_fleets_evidence_at_one_call_a_second() {
    let calls = calls_after_healthy_traffic(1_000).await;
    println!("fleet count window: 20 processes x 1 call/s after 3 s healthy: {calls} calls until all reject");
    assert!(calls <= 2 * 10, "{calls} calls (2 x minimum_calls)");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_count_window_judges_the_newest_calls_and_healthy_calls_after_failures_count() {
    let store = MemoryStore::new();
    let rule = FleetRule::new(10, secs(1), secs(5))
        .with_minimum_calls(10)
        .with_count_window(20);
    // Long healthy history: it does not outweigh ten failures that follow.
    store
        .report("x", Report::new(3_000, 0, 0), rule)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(30)).await;
    for i in 0..10 {
        let report = Report::new(6, 1, 0).with_tail(1, Duration::from_millis(20));
        let decision = store.report("x", report, rule).await.unwrap();
        if i < 9 {
            assert_eq!(decision, Decision::Missing, "report {i}");
        } else {
            assert_eq!(decision, Decision::Open { remaining: secs(5) });
        }
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    // Failures followed by newer successes: the newest 20 are healthy.
    let store = MemoryStore::new();
    store
        .report(
            "y",
            Report::new(9, 9, 0).with_tail(9, Duration::from_millis(5)),
            rule,
        )
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(
        store
            .report("y", Report::new(20, 0, 0), rule)
            .await
            .unwrap(),
        Decision::Missing
    );
    assert_eq!(
        store
            .report("y", Report::new(1, 1, 0).with_tail(1, Duration::ZERO), rule)
            .await
            .unwrap(),
        Decision::Missing,
        "the older failures are out of the newest 20"
    );
    // Parts older than the buckets' span are gone.
    let store = MemoryStore::new();
    store
        .report("z", Report::new(9, 9, 0).with_tail(9, Duration::ZERO), rule)
        .await
        .unwrap();
    tokio::time::advance(secs(11)).await;
    assert_eq!(
        store
            .report("z", Report::new(1, 1, 0).with_tail(1, Duration::ZERO), rule)
            .await
            .unwrap(),
        Decision::Missing
    );
}
