//! The store alarm of breakers that share one fleet configuration (a keyed
//! registry's): one `circuit_store_failed` warning a second for all of
//! them, and one `circuit_store_recovered` per outage.

mod support;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tower_breaker::store::{Decision, Election, ProbeToken, Store, StoreError, StoreFuture};
use tower_breaker::{BreakerRegistry, FleetConfig};

/// A store that is down (every call fails) until told otherwise.
#[derive(Debug, Default)]
struct Outage {
    up: AtomicBool,
}

impl Outage {
    fn answer<T: Send + 'static>(&self, value: T) -> StoreFuture<'_, T> {
        let up = self.up.load(SeqCst);
        Box::pin(async move {
            if up {
                Ok(value)
            } else {
                Err(StoreError::new("connection refused"))
            }
        })
    }
}

impl Store for Outage {
    fn try_open<'a>(&'a self, _name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        self.answer(open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        _name: &'a str,
        _open_for: Duration,
        _lease: Duration,
    ) -> StoreFuture<'a, Election> {
        self.answer(Election::Closed)
    }
    fn close<'a>(&'a self, _name: &'a str, _token: ProbeToken) -> StoreFuture<'a, bool> {
        self.answer(true)
    }
    fn reopen<'a>(
        &'a self,
        _name: &'a str,
        _token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        self.answer(open_for)
    }
    fn read<'a>(&'a self, _name: &'a str) -> StoreFuture<'a, Decision> {
        self.answer(Decision::Closed)
    }
}

/// Regression: each of a keyed registry's breakers warned on its own, so
/// a store outage under 200 keys was 200 warnings a second.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_store_outage_under_a_keyed_registry_is_one_warning_a_second() {
    let events = Events::default();
    let _guard = resilience_testkit::set_default(events.clone());
    let store = Arc::new(Outage::default());
    let registry: BreakerRegistry<u32> =
        BreakerRegistry::new("host", config().fleet(FleetConfig::new(store.clone())));
    for key in 0..200 {
        assert!(registry.get(&key).refresh().await.is_err());
    }
    assert_eq!(
        events.mentioning("circuit_store_failed"),
        1,
        "the first failure"
    );
    assert_eq!(
        registry.get(&0).snapshot().totals.store_errors,
        1,
        "every failure is still counted, by its breaker"
    );
    events.take();

    advance(secs(1)).await;
    assert!(registry.get(&7).refresh().await.is_err());
    let warnings = events.take();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].1["failures"], "200",
        "199 held back, and this one"
    );

    store.up.store(true, SeqCst);
    for key in 0..200 {
        registry.get(&key).refresh().await.unwrap();
    }
    assert_eq!(events.mentioning("circuit_store_recovered"), 1);
}

/// Breakers with fleet configurations of their own keep alarms of their
/// own: each one's first failure is told.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn breakers_with_their_own_fleet_configuration_each_warn() {
    let events = Events::default();
    let _guard = resilience_testkit::set_default(events.clone());
    let store: Arc<dyn Store> = Arc::new(Outage::default());
    for name in ["a", "b", "c"] {
        let b = tower_breaker::Breaker::with_config(
            name,
            config().fleet(FleetConfig::new(store.clone())),
        );
        assert!(b.refresh().await.is_err());
    }
    assert_eq!(events.mentioning("circuit_store_failed"), 3);
}
