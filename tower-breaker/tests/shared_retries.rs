//! A retry budget shared by a fleet through the breaker's store
//! (`Breaker::share_retries`, `Store::claim_retry`): the credit rides on
//! the breaker's reports, claims are bounded by the fleet's requests and
//! one fleet-wide floor, racing claims never grant more.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tower_breaker::store::{BudgetRule, MemoryStore, Report, Store};
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, FleetRetries, Outcome};
use tower_resilience_base::fleet::{Claim, SharedRetries};

const WINDOW: Duration = Duration::from_secs(10);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A process of the fleet: its breaker on `store`, its request counter,
/// and its share of the fleet's budget.
struct Process {
    breaker: Breaker,
    requests: Arc<AtomicU64>,
    shared: FleetRetries,
}

impl Process {
    fn new(store: &Arc<MemoryStore>, floor: u64) -> Self {
        let config = BreakerConfig::new()
            .minimum_calls(1_000)
            .fleet(FleetConfig::new(store.clone()).refresh_interval(Duration::from_millis(100)));
        let breaker = Breaker::with_config("dep", config);
        let requests = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&requests);
        let shared = breaker
            .share_retries(0.1, BudgetRule::new(WINDOW, floor), move || {
                counted.load(SeqCst)
            })
            .expect("a breaker with a store shares its budget");
        Self {
            breaker,
            requests,
            shared,
        }
    }

    /// `n` requests, each one successful call.
    fn requests(&self, n: u64) {
        for _ in 0..n {
            self.requests.fetch_add(1, SeqCst);
            self.breaker
                .try_acquire()
                .expect("closed")
                .record(Outcome::Success);
        }
    }
}

async fn granted(shared: &FleetRetries, tries: usize) -> usize {
    let mut n = 0;
    for _ in 0..tries {
        if shared.claim().await == Claim::Granted {
            n += 1;
        }
    }
    n
}

#[tokio::test(start_paused = true)]
async fn the_memory_store_grants_the_floor_or_the_earnings_whichever_is_larger() {
    let store = MemoryStore::new();
    let rule = BudgetRule::new(WINDOW, 2);
    let claim = || store.claim_retry("dep", rule);
    // The floor alone: two.
    assert!(claim().await.unwrap());
    assert!(claim().await.unwrap());
    assert!(!claim().await.unwrap());
    // 50 requests at 10% earn five: the larger of floor and earnings, not
    // their sum, so three more.
    let report = Report::new(50, 0, 0).with_credit(5_000_000);
    let fleet = tower_breaker::store::FleetRule::new(10, secs(1), secs(5))
        .with_minimum_calls(1_000)
        .with_budget(rule);
    store.report("dep", report, fleet).await.unwrap();
    let mut more = 0;
    while claim().await.unwrap() {
        more += 1;
    }
    assert_eq!(more, 3);
}

#[tokio::test(start_paused = true)]
async fn the_previous_epoch_counts_in_proportion_to_the_share_the_window_still_covers() {
    let store = MemoryStore::new();
    let rule = BudgetRule::new(WINDOW, 0);
    let fleet = tower_breaker::store::FleetRule::new(10, secs(1), secs(5))
        .with_minimum_calls(1_000)
        .with_budget(rule);
    // Align to the start of an epoch of the store's clock.
    tokio::time::advance(WINDOW).await;
    let report = Report::new(30, 0, 0).with_credit(3_000_000);
    store.report("dep", report, fleet).await.unwrap();
    assert!(store.claim_retry("dep", rule).await.unwrap());
    // Halfway into the next epoch, half of the last one counts: 1.5
    // retries earned, 0.5 claimed, so one more and no second.
    tokio::time::advance(WINDOW * 3 / 2).await;
    assert!(store.claim_retry("dep", rule).await.unwrap());
    assert!(!store.claim_retry("dep", rule).await.unwrap());
    // A whole window later, nothing of it is left.
    tokio::time::advance(WINDOW).await;
    let report = Report::new(5, 0, 0).with_credit(500_000);
    store.report("dep", report, fleet).await.unwrap();
    assert!(!store.claim_retry("dep", rule).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_fleet_of_quiet_processes_shares_one_budget_not_one_floor_each() {
    // 20 processes of 5 requests each: alone, each one's floor would pay
    // for every retry it can make; shared, the fleet has 10% of 100.
    let store = Arc::new(MemoryStore::new());
    let fleet: Vec<Process> = (0..20).map(|_| Process::new(&store, 0)).collect();
    for process in &fleet {
        process.requests(5);
        process.breaker.flush().await.unwrap();
    }
    let mut total = 0;
    for process in &fleet {
        total += granted(&process.shared, 3).await;
    }
    assert_eq!(total, 10, "10% of the fleet's 100 requests");
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_remembered_for_a_refresh_interval_without_asking_the_store() {
    let store = Arc::new(MemoryStore::new());
    let process = Process::new(&store, 0);
    assert_eq!(process.shared.claim().await, Claim::Refused);
    process.requests(10);
    process.breaker.flush().await.unwrap();
    assert_eq!(
        process.shared.claim().await,
        Claim::Refused,
        "within the refresh interval of the refusal, the store is not asked"
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(process.shared.claim().await, Claim::Granted);
}

#[tokio::test(start_paused = true)]
async fn a_retry_given_back_is_credited_by_the_next_report() {
    let store = Arc::new(MemoryStore::new());
    let process = Process::new(&store, 1);
    assert_eq!(process.shared.claim().await, Claim::Granted);
    assert_eq!(process.shared.claim().await, Claim::Refused);
    // Granted, never sent: given back, carried by the next report.
    process.shared.give_back();
    process.requests(1); // 0.1 of a retry: not enough alone
    process.breaker.flush().await.unwrap();
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(process.shared.claim().await, Claim::Granted);
    assert_eq!(
        granted(&process.shared, 1).await,
        0,
        "one given back, one spent"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_without_budgets_answers_unavailable_so_each_process_keeps_its_own() {
    #[derive(Debug)]
    struct Plain(MemoryStore);
    impl Store for Plain {
        fn try_open<'a>(
            &'a self,
            name: &'a str,
            open_for: Duration,
        ) -> tower_breaker::store::StoreFuture<'a, Duration> {
            self.0.try_open(name, open_for)
        }
        fn try_acquire_probe<'a>(
            &'a self,
            name: &'a str,
            open_for: Duration,
            lease: Duration,
        ) -> tower_breaker::store::StoreFuture<'a, tower_breaker::store::Election> {
            self.0.try_acquire_probe(name, open_for, lease)
        }
        fn close<'a>(
            &'a self,
            name: &'a str,
            token: tower_breaker::store::ProbeToken,
        ) -> tower_breaker::store::StoreFuture<'a, bool> {
            self.0.close(name, token)
        }
        fn read<'a>(
            &'a self,
            name: &'a str,
        ) -> tower_breaker::store::StoreFuture<'a, tower_breaker::store::Decision> {
            self.0.read(name)
        }
    }
    let breaker = Breaker::with_config(
        "dep",
        BreakerConfig::new().store(Arc::new(Plain(MemoryStore::new()))),
    );
    let shared = breaker
        .share_retries(0.1, BudgetRule::new(WINDOW, 0), || 0)
        .unwrap();
    assert_eq!(shared.claim().await, Claim::Unavailable);
}

#[test]
fn a_breaker_without_a_store_shares_nothing() {
    let breaker = Breaker::new("alone");
    assert!(breaker
        .share_retries(0.1, BudgetRule::new(WINDOW, 3), || 0)
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_of_many_processes_never_grant_more_than_the_fleet_earned() {
    // 16 processes, 40 requests each (64 retries earned at 10%), a floor
    // of 4 (below the earnings: it adds nothing); each races 20 claims.
    let store = Arc::new(MemoryStore::new());
    let fleet: Vec<Arc<Process>> = (0..16).map(|_| Arc::new(Process::new(&store, 4))).collect();
    for process in &fleet {
        process.requests(40);
        process.breaker.flush().await.unwrap();
    }
    let granted_total = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = fleet
        .iter()
        .map(|process| {
            let process = Arc::clone(process);
            let granted_total = Arc::clone(&granted_total);
            tokio::spawn(async move {
                for _ in 0..20 {
                    if process.shared.claim().await == Claim::Granted {
                        granted_total.fetch_add(1, SeqCst);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let granted = granted_total.load(SeqCst);
    // All in one epoch unless the run straddles a boundary of the store's
    // 10 s epochs (then the new epoch's floor may add up to 4).
    assert!((64..=68).contains(&granted), "granted {granted}, earned 64");
}
