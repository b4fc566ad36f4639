//! A probe that ends while its lease is being renewed: the close (or
//! re-open) must use the renewal's token, on a store whose renewals write
//! a fresh token (as the DynamoDB store's do).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tower_breaker::store::{Decision, Election, MemoryStore, ProbeToken, Store, StoreFuture};
use tower_breaker::{Breaker, FleetConfig, Outcome, State};

/// A memory store whose renewals write a fresh token at once and answer
/// `delay` later (the answer of a write the store applied is on its way),
/// and which fences a close or re-open by the latest token.
#[derive(Debug, Default)]
struct FreshRenewals {
    inner: MemoryStore,
    delay: Duration,
    /// The token the fleet knows (the latest renewal's), and the inner
    /// store's own.
    current: Mutex<Option<(u64, ProbeToken)>>,
    fenced: AtomicUsize,
}

impl FreshRenewals {
    /// The inner token for `token`, if it is the latest.
    fn inner_token(&self, token: ProbeToken) -> Option<ProbeToken> {
        match *self.current.lock().unwrap() {
            Some((latest, inner)) if latest == token.get() => Some(inner),
            _ => {
                self.fenced.fetch_add(1, SeqCst);
                None
            }
        }
    }
}

impl Store for FreshRenewals {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        self.inner.try_open(name, open_for)
    }
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        Box::pin(async move {
            let election = self.inner.try_acquire_probe(name, open_for, lease).await?;
            if let Election::Won(token) = election {
                *self.current.lock().unwrap() = Some((token.get(), token));
            }
            Ok(election)
        })
    }
    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            match self.inner_token(token) {
                Some(inner) => self.inner.close(name, inner).await,
                None => Ok(false),
            }
        })
    }
    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        Box::pin(async move {
            match self.inner_token(token) {
                Some(inner) => self.inner.reopen(name, inner, open_for).await,
                None => Ok(Duration::ZERO),
            }
        })
    }
    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        self.inner.read(name)
    }
    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        Box::pin(async move {
            let fresh = {
                let mut current = self.current.lock().unwrap();
                match *current {
                    Some((latest, inner)) if latest == token.get() => {
                        let fresh = latest + 1_000;
                        *current = Some((fresh, inner));
                        Some((fresh, inner))
                    }
                    _ => None,
                }
            };
            let Some((fresh, inner)) = fresh else {
                return Ok(None);
            };
            self.inner.renew_probe(name, inner, lease).await?;
            // Applied; the answer takes this long to come back.
            tokio::time::sleep(self.delay).await;
            Ok(Some(ProbeToken::new(fresh).with_reopens(token.reopens())))
        })
    }
    fn renews_leases(&self) -> bool {
        true
    }
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// The elected prober's lease (300 ms) is renewed every 100 ms, and the
/// renewal's answer takes 50 ms: the probe ends 20 ms into a renewal.
/// Before, its close went with the token the renewal had just replaced
/// and was fenced (the fleet stayed open until the lease lapsed and
/// another probe ran); now it waits for the renewal and uses its token.
async fn probe_ending_during_a_renewal(outcome: Outcome) -> (Arc<FreshRenewals>, Breaker) {
    let store = Arc::new(FreshRenewals {
        delay: ms(50),
        ..FreshRenewals::default()
    });
    let b = Breaker::with_config(
        "dep",
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(secs(1))
            .fleet(FleetConfig::new(store.clone()).probe_lease(ms(300))),
    );
    record(&b, Outcome::Failure, 2);
    settle().await;
    assert_eq!(state(&b), State::Open);
    advance(secs(1)).await;
    let probe = b.acquire().await.expect("the probe");
    assert!(probe.is_probe());
    advance(ms(120)).await; // the renewal at 100 ms answers at 150 ms
    settle().await;
    probe.record(outcome);
    advance(ms(100)).await;
    settle().await;
    (store, b)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_that_succeeds_during_a_renewal_closes_the_fleet() {
    let (store, b) = probe_ending_during_a_renewal(Outcome::Success).await;
    assert_eq!(store.fenced.load(SeqCst), 0, "the close was not fenced");
    assert_eq!(store.read("dep").await.unwrap(), Decision::Closed);
    assert_eq!(state(&b), State::Closed);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_that_fails_during_a_renewal_reopens_the_fleet() {
    let (store, _b) = probe_ending_during_a_renewal(Outcome::Failure).await;
    assert_eq!(store.fenced.load(SeqCst), 0, "the re-open was not fenced");
    assert!(matches!(
        store.read("dep").await.unwrap(),
        Decision::Open { .. }
    ));
}
