//! The contract of [`tower_breaker::store::Store`] as tests: one behavioural
//! test per clause, that every store runs against its real server (the
//! memory store in-process, Redis, DynamoDB through moto) and that a store
//! of your own can run too.
//!
//! The clauses are the `async fn`s of [`clauses`], each taking the store
//! and a name of its own; [`tests!`](crate::tests) expands to one
//! `#[tokio::test]` per clause, given a function that makes a fresh
//! [`Fixture`] (a store, and whatever keeps its server alive) or `None` to
//! skip, loudly, where the server is missing.
//!
//! The clauses run on the real clock, with periods of a few hundred
//! milliseconds and margins of 100 ms or more: a store's clock may be its
//! server's (Redis), which no test can pause.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tower_breaker::store::MemoryStore;
//! use tower_breaker_conformance::Fixture;
//!
//! async fn memory(_clause: &'static str) -> Option<Fixture> {
//!     Some(Fixture::new(Arc::new(MemoryStore::new())))
//! }
//!
//! // In an integration test file: one test per clause.
//! // tower_breaker_conformance::tests!(memory);
//! # let _ = memory;
//! ```

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use tower_breaker::store::Store;

pub mod clauses;
pub mod fleet;
pub mod frozen;

/// A store under test, and what keeps its server alive until the clause
/// ends (a child process, say).
pub struct Fixture {
    /// The store.
    pub store: Arc<dyn Store>,
    _guard: Option<Box<dyn Any + Send>>,
}

impl Fixture {
    /// A fixture of `store` alone (an in-process store).
    #[must_use]
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            _guard: None,
        }
    }

    /// A fixture of `store` that keeps `guard` (its server) alive.
    #[must_use]
    pub fn with_guard(store: Arc<dyn Store>, guard: impl Any + Send) -> Self {
        Self {
            store,
            _guard: Some(Box::new(guard)),
        }
    }
}

impl fmt::Debug for Fixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Whether `program` runs (`program arg` succeeds), for a fixture that
/// starts a server: when it does not, says so on the real stderr (not
/// captured by the test harness) with `hint`, so that `test` can skip;
/// with `TOWER_REQUIRE_SERVERS` set (as a CI that installs the servers
/// does), a missing server fails the test instead.
///
/// # Panics
///
/// When `program` does not run and `TOWER_REQUIRE_SERVERS` is set.
///
/// # Example
///
/// ```no_run
/// use tower_breaker_conformance::server_found;
///
/// if !server_found("redis-server", "--version", "my_test", "install redis") {
///     return; // skipped, and said so
/// }
/// ```
pub fn server_found(program: &str, arg: &str, test: &str, hint: &str) -> bool {
    use std::io::Write as _;
    let found = std::process::Command::new(program)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        assert!(
            std::env::var_os("TOWER_REQUIRE_SERVERS").is_none(),
            "{program} not found and TOWER_REQUIRE_SERVERS is set: `{test}` must run"
        );
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipped: {program} not found ({hint}): {test}"
        );
    }
    found
}

/// One `#[tokio::test]` per clause of the contract, each on a fresh
/// fixture from `$make`, an `async fn(&'static str) -> Option<Fixture>`
/// called with the clause's name (it returns `None` to skip, having said
/// why). The calling crate needs `tokio` with its `macros` and
/// `rt-multi-thread` features.
#[macro_export]
macro_rules! tests {
    ($make:path) => {
        $crate::__clauses!(
            $make;
            a_name_never_written_reads_missing,
            an_opening_lasts_its_period_and_concurrent_openers_adopt_it,
            an_opening_whose_period_passed_reads_expired,
            an_election_before_t_is_lost_with_the_time_left,
            one_caller_of_many_wins_the_election_once_t_has_passed,
            the_winners_lease_holds_off_other_candidates_past_t,
            a_read_during_a_probe_says_probing_with_its_lease,
            a_probe_given_back_is_won_by_the_next_candidate_at_once,
            a_renewed_lease_holds_off_candidates_and_a_lapsed_one_is_fenced,
            the_winner_closes_and_a_stranger_cannot,
            a_closed_circuit_refuses_elections_and_a_stale_reopen,
            a_failed_probe_reopens_and_the_next_prober_learns_it,
            a_reopen_and_the_next_read_agree_on_the_time_left,
            reports_add_up_and_open_the_circuit_when_the_rule_breaks,
            reports_while_open_are_not_evidence,
            evidence_from_before_an_election_never_counts_after_the_close,
            a_count_window_judges_the_newest_calls_whatever_came_before,
            racing_retry_claims_grant_the_larger_of_floor_and_credit,
            retry_credit_leaves_the_window_after_it,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __clauses {
    ($make:path; $($clause:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $clause() {
                let Some(fixture) = $make(stringify!($clause)).await else {
                    return;
                };
                $crate::clauses::$clause(&fixture.store, stringify!($clause)).await;
            }
        )*
    };
}
