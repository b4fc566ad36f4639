//! `Breaker::flush`, `FleetConfig::flush` and `FlushLayer`: what a breaker
//! counted reaches its store before a process is frozen or exits, and a
//! flush with nothing pending costs no store call.

mod support;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_breaker::store::{
    Decision, Election, FleetRule, MemoryStore, ProbeToken, Report, Store, StoreError, StoreFuture,
};
use tower_breaker::{Breaker, BreakerRegistry, FleetConfig, FlushLayer, Outcome};

/// A memory store that counts every call made to it, sums the reports it
/// applied, and can be slowed down or made to refuse reports.
#[derive(Debug, Default)]
struct Ledger {
    inner: MemoryStore,
    calls: AtomicU64,
    reported_calls: AtomicU64,
    reported_failures: AtomicU64,
    /// How long each report takes (ms).
    report_ms: AtomicU64,
    /// Reports still to refuse, as "not applied".
    refuse: AtomicU64,
}

impl Ledger {
    fn calls(&self) -> u64 {
        self.calls.load(SeqCst)
    }
    fn reported(&self) -> (u64, u64) {
        (
            self.reported_calls.load(SeqCst),
            self.reported_failures.load(SeqCst),
        )
    }
    fn call(&self) {
        self.calls.fetch_add(1, SeqCst);
    }
}

impl Store for Ledger {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        self.call();
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        self.call();
        self.inner.try_acquire_probe(name, open_for, lease)
    }
    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        self.call();
        self.inner.close(name, token)
    }
    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        self.call();
        self.inner.reopen(name, token, open_for)
    }
    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        self.call();
        self.inner.read(name)
    }
    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> StoreFuture<'a, Decision> {
        self.call();
        Box::pin(async move {
            let delay = self.report_ms.load(SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let refused = self
                .refuse
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if refused {
                return Err(StoreError::new("connection refused").not_applied());
            }
            self.reported_calls.fetch_add(report.calls, SeqCst);
            self.reported_failures.fetch_add(report.failures, SeqCst);
            self.inner.report(name, report, rule).await
        })
    }
}

fn fleet(store: &Arc<Ledger>) -> FleetConfig {
    // Reads only when asked: the tests count every store call.
    FleetConfig::new(store.clone()).refresh_interval(secs(3600))
}

/// `n` calls, every `every`-th of them failed (0: none).
fn calls(breaker: &Breaker, n: u64, every: u64) {
    for i in 1..=n {
        let failed = every > 0 && i % every == 0;
        breaker.try_acquire().expect("closed").record(if failed {
            Outcome::Failure
        } else {
            Outcome::Success
        });
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_flush_with_nothing_pending_makes_no_store_call() {
    let store = Arc::new(Ledger::default());
    let fleet = fleet(&store);
    let breaker = Breaker::with_config("quiet", config().fleet(fleet.clone()));
    // Never called.
    breaker.flush().await.unwrap();
    fleet.flush().await.unwrap();
    assert!(!fleet.has_pending());
    assert_eq!(store.calls(), 0, "a breaker that never called");

    // Called, flushed: the second flush has nothing left.
    calls(&breaker, 3, 0);
    breaker.flush().await.unwrap();
    let after_first = store.calls();
    assert!(after_first >= 1, "the first flush reports");
    breaker.flush().await.unwrap();
    fleet.flush().await.unwrap();
    assert_eq!(store.calls(), after_first, "nothing was pending");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_flush_reports_every_outcome_counted_before_it_returns() {
    let store = Arc::new(Ledger::default());
    store.report_ms.store(30, SeqCst);
    let breaker = Breaker::with_config("ledger", config().fleet(fleet(&store)));
    // 10 calls, 2 failures: under the breaker's thresholds.
    calls(&breaker, 10, 5);
    let started = tokio::time::Instant::now();
    breaker.flush().await.unwrap();
    assert_eq!(store.reported(), (10, 2));
    assert!(
        started.elapsed() >= ms(30),
        "the flush waited for the report's answer"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_flush_stops_at_its_timeout_and_tells_what_is_left() {
    let store = Arc::new(Ledger::default());
    store.report_ms.store(2_000, SeqCst);
    let fleet = fleet(&store).flush_timeout(ms(100));
    let breaker = Breaker::with_config("slow", config().fleet(fleet));
    calls(&breaker, 4, 0);
    let started = tokio::time::Instant::now();
    let left = breaker.flush().await.unwrap_err();
    assert_eq!(started.elapsed(), ms(100));
    assert_eq!(left.in_flight, 1, "{left}");
    assert_eq!(left.unreported_calls, 0, "the report is on its way");
    // It arrives later all the same.
    tokio::time::sleep(secs(2)).await;
    assert_eq!(store.reported(), (4, 0));
}

/// A report the store did not apply (a refused connection) is carried by
/// the next flush: nothing is lost, nothing is counted twice.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refused_report_is_left_for_the_next_flush() {
    let store = Arc::new(Ledger::default());
    store.refuse.store(1, SeqCst);
    let breaker = Breaker::with_config("refused", config().fleet(fleet(&store)));
    calls(&breaker, 6, 3);
    // The first failure (the third call) sent a report of its own, which
    // the store refused; the flush reported the calls after it.
    let left = breaker.flush().await.unwrap_err();
    assert_eq!(
        (left.unreported_calls, left.failed_reports),
        (3, 1),
        "{left}"
    );
    assert_eq!(store.reported(), (3, 1));
    breaker.flush().await.unwrap();
    assert_eq!(store.reported(), (6, 2));
}

/// `FleetConfig::flush` reaches every breaker built from the configuration
/// or its clones, keyed ones included, and skips the dropped ones.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_fleet_flush_covers_every_breaker_of_its_configuration() {
    let store = Arc::new(Ledger::default());
    let fleet = fleet(&store);
    let a = Breaker::with_config("a", config().fleet(fleet.clone()));
    let b = Breaker::with_config("b", config().fleet(fleet.clone()));
    let registry: BreakerRegistry<u32> =
        BreakerRegistry::new("host", config().fleet(fleet.clone()));
    calls(&a, 3, 0);
    calls(&b, 4, 0);
    for key in 0..5 {
        calls(&registry.get(&key), 2, 0);
    }
    let dropped = Breaker::with_config("gone", config().fleet(fleet.clone()));
    drop(dropped);
    assert!(fleet.has_pending());
    fleet.flush().await.unwrap();
    assert_eq!(store.reported(), (3 + 4 + 5 * 2, 0));
    assert!(!fleet.has_pending());
}

/// Regression for the serverless mode: a handler behind `FlushLayer`
/// returns only once the outcomes of its calls are in the store.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_behind_the_flush_layer_returns_after_its_report() {
    let store = Arc::new(Ledger::default());
    store.report_ms.store(40, SeqCst);
    let fleet = fleet(&store);
    let breaker = Breaker::with_config("dep", config().fleet(fleet.clone()));
    let handler = service_fn(move |n: u64| {
        let breaker = breaker.clone();
        async move {
            calls(&breaker, n, 0);
            Ok::<_, BoxError>(n)
        }
    });
    let mut handler = tower::ServiceBuilder::new()
        .layer(FlushLayer::new(fleet.clone()))
        .service(handler);
    let started = tokio::time::Instant::now();
    let n = handler.ready().await.unwrap().call(5).await.unwrap();
    assert_eq!(n, 5);
    assert_eq!(
        store.reported(),
        (5, 0),
        "in the store when the handler returned"
    );
    assert_eq!(started.elapsed(), ms(40));

    // An invocation that made no call returns at once, without the store.
    let before = store.calls();
    let started = tokio::time::Instant::now();
    handler.ready().await.unwrap().call(0).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(store.calls(), before);
}

/// Many tasks record outcomes and flush at once: after a last flush the
/// store holds every outcome exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_flushes_report_every_outcome_exactly_once() {
    let store = Arc::new(Ledger::default());
    let fleet = fleet(&store);
    let breaker = Breaker::with_config("race", config().fleet(fleet.clone()));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                for _ in 0..50 {
                    calls(&breaker, 5, 0);
                    let _ = breaker.flush().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    fleet.flush().await.unwrap();
    assert_eq!(store.reported(), (16 * 50 * 5, 0));
}
