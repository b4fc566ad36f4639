//! A retry budget shared by the fleet through a breaker's store: the
//! credit its requests earn rides on the breaker's reports, and a retry
//! its process cannot pay for claims one from the store
//! ([`Store::claim_retry`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_resilience_base::fleet::{Claim, ClaimFuture, SharedRetries};

use super::machine::Core;
use super::{Breaker, NANOS_PER_MS, PPM};
use crate::store::{self, BudgetRule};

/// A fleet's retry budget as one breaker shares it.
pub(crate) struct BudgetLink {
    pub(super) rule: BudgetRule,
    ratio_ppm: u64,
    /// The process's requests so far (the retry budget's counter).
    requests: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The requests whose credit was taken for a report.
    reported: Mutex<u64>,
    /// Credit to add to the next report, of reports the store certainly
    /// did not apply.
    credit_back: AtomicU64,
    /// Retries the fleet granted that were not sent, for the next report.
    returned: AtomicU64,
    /// Until when (the breaker's clock) a claim is refused without asking
    /// the store, after the store refused one.
    refused_until_ns: AtomicU64,
}

impl BudgetLink {
    /// The credit earned since the last report (in millionths of a
    /// retry), and the granted retries given back since.
    pub(super) fn take_credit(&self) -> (u64, u64) {
        let total = (self.requests)();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let new = total.saturating_sub(*reported);
        *reported = (*reported).max(total);
        let credit = new
            .saturating_mul(self.ratio_ppm)
            .saturating_add(self.credit_back.swap(0, Relaxed));
        (credit, self.returned.swap(0, Relaxed))
    }

    /// What a report the store did not apply carried, for the next one.
    pub(super) fn not_applied(&self, credit: u64, returned: u64) {
        self.credit_back.fetch_add(credit, Relaxed);
        self.returned.fetch_add(returned, Relaxed);
    }
}

/// A retry budget's share of its fleet's, through a breaker's store: what
/// [`Breaker::share_retries`] returns, for
/// `RetryBudget::share` (`tower-retry-budget`); `tower-shield`'s stacks
/// attach it on their own when their breaker has a store.
///
/// A [`claim`](SharedRetries::claim) asks the store
/// ([`Store::claim_retry`](crate::store::Store::claim_retry)), bounded by
/// the fleet's [flush timeout](crate::FleetConfig::flush_timeout); after a
/// refusal, the claims of the next refresh interval are refused without
/// asking. A store that fails, or that does not share budgets, answers
/// [`Claim::Unavailable`]: the retry layer then decides by its own budget.
#[derive(Clone)]
pub struct FleetRetries {
    core: Arc<Core>,
}

impl fmt::Debug for FleetRetries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let link = self.core.store.as_ref().and_then(|l| l.budget.get());
        f.debug_struct("FleetRetries")
            .field("breaker", &self.core.name)
            .field("rule", &link.map(|l| l.rule))
            .finish()
    }
}

impl SharedRetries for FleetRetries {
    fn claim(&self) -> ClaimFuture {
        let core = Arc::clone(&self.core);
        Box::pin(async move { core.claim_retry().await })
    }

    fn give_back(&self) {
        if let Some(link) = self.core.store.as_ref().and_then(|l| l.budget.get()) {
            link.returned.fetch_add(1, Relaxed);
        }
    }
}

impl Core {
    /// Asks the store for one retry of the fleet's budget.
    async fn claim_retry(self: Arc<Self>) -> Claim {
        let Some(link) = self.store.as_ref() else {
            return Claim::Unavailable;
        };
        let Some(budget) = link.budget.get() else {
            return Claim::Unavailable;
        };
        if self.now_ns() < budget.refused_until_ns.load(Relaxed) {
            return Claim::Refused;
        }
        let timeout = self
            .config
            .fleet
            .as_ref()
            .map_or(Duration::from_millis(500), |f| f.flush_timeout);
        let answer = store::within(timeout, link.store.claim_retry(&self.name, budget.rule)).await;
        match answer {
            Ok(Ok(true)) => Claim::Granted,
            Ok(Ok(false)) => {
                let until = self.now_ns() + link.refresh_ns.max(NANOS_PER_MS);
                budget.refused_until_ns.fetch_max(until, Relaxed);
                Claim::Refused
            }
            Ok(Err(error)) => {
                if !error.is_not_applied() {
                    tracing::debug!(breaker = %self.name, error = %error, "retry claim failed");
                }
                Claim::Unavailable
            }
            Err(elapsed) => {
                tracing::debug!(breaker = %self.name, error = %elapsed, "retry claim timed out");
                Claim::Unavailable
            }
        }
    }
}

impl Breaker {
    /// Shares a retry budget with the fleet through this breaker's store:
    /// the requests that `requests` counts (a running total of this
    /// process's requests, read at each report) earn `ratio` of a retry
    /// each in the store, and the fleet's retries are bounded by `rule`
    /// (see [`BudgetRule`]). Returns the handle a retry budget claims
    /// retries through, or `None` when the breaker has no store or does
    /// not share its evidence (its reports carry the credit).
    ///
    /// A breaker shares one budget: a second call returns a handle to the
    /// first one's.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// use std::time::Duration;
    /// use tower_breaker::store::{BudgetRule, MemoryStore};
    /// use tower_breaker::{Breaker, BreakerConfig, Outcome};
    /// use tower_resilience_base::fleet::{Claim, SharedRetries};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// let breaker = Breaker::with_config("api", BreakerConfig::new().store(store));
    /// let requests = Arc::new(AtomicU64::new(0));
    /// let counted = Arc::clone(&requests);
    /// let rule = BudgetRule::new(Duration::from_secs(10), 0);
    /// let shared = breaker
    ///     .share_retries(0.1, rule, move || counted.load(Relaxed))
    ///     .expect("the breaker has a store");
    ///
    /// // No request yet, and no floor: no retry.
    /// assert_eq!(shared.claim().await, Claim::Refused);
    /// // Ten requests (and their calls), reported: one retry.
    /// for _ in 0..10 {
    ///     requests.fetch_add(1, Relaxed);
    ///     breaker.try_acquire().unwrap().record(Outcome::Success);
    /// }
    /// breaker.flush().await.unwrap();
    /// tokio::time::advance(Duration::from_secs(1)).await; // the refusal is remembered for a refresh interval
    /// assert_eq!(shared.claim().await, Claim::Granted);
    /// # }
    /// ```
    pub fn share_retries(
        &self,
        ratio: f64,
        rule: BudgetRule,
        requests: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Option<FleetRetries> {
        let link = self.core.store.as_ref()?;
        if !link.shares_evidence() {
            return None;
        }
        let ratio_ppm = if ratio.is_finite() && ratio > 0.0 {
            (ratio.min(1_000.0) * PPM as f64).round() as u64
        } else {
            0
        };
        let _ = link.budget.get_or_init(|| BudgetLink {
            rule,
            ratio_ppm,
            requests: Box::new(requests),
            reported: Mutex::new(0),
            credit_back: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            refused_until_ns: AtomicU64::new(0),
        });
        Some(FleetRetries {
            core: Arc::clone(&self.core),
        })
    }
}
