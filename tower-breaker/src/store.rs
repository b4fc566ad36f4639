//! Where the decision lives: the store trait a shared (fleet-wide) breaker
//! state plugs into, and [`MemoryStore`].
//!
//! Without a store (the default), each [`Breaker`](crate::Breaker) decides
//! alone with its own atomics. With one
//! ([`BreakerConfig::store`](crate::BreakerConfig::store)), the breakers of
//! many processes that share it behave as one circuit, following the "open
//! until T" design: the store holds, per breaker name, one record with the
//! time T until which the circuit is open. Its presence is not the state:
//! the circuit is open only while T is in the future.
//!
//! - Each breaker still counts its own calls in its own window. When its
//!   window trips, it opens locally at once and writes the opening through
//!   with [`Store::try_open`], which never pushes an existing, later T
//!   forward; the breaker adopts the store's T.
//! - Every breaker reads the record with [`Store::read`] at most once per
//!   [`refresh_interval`](crate::FleetConfig::refresh_interval) (in a
//!   spawned task; the call that notices the interval is over does not
//!   wait), and opens when another process did.
//! - When its open period is over (or a read finds an expired record), a
//!   breaker asks [`Store::try_acquire_probe`] instead of probing at once:
//!   exactly one caller fleet-wide wins (by moving T forward one longer open
//!   period); the others stay open until the new T. Meanwhile its callers
//!   are rejected, as while open.
//! - The winner's probe decides: success deletes the record with
//!   [`Store::close`] (only if it still holds the winner's token) and every
//!   other breaker closes at its next read; failure re-opens with
//!   [`Store::reopen`], for the next, longer period. The record counts the
//!   re-opens in a row and hands the count to the next winner in its
//!   [`ProbeToken`], so the period grows fleet-wide, whichever process
//!   probes.
//!
//! Store calls happen only on these rare paths, never on the closed path
//! beyond one clock read to see whether a read is due. When a store call
//! fails, the breaker **fails open** by default: it keeps its local
//! decision, counts the error in
//! [`Totals::store_errors`](crate::snapshot::Totals::store_errors) and emits a
//! `circuit_store_failed` warning (and `circuit_store_recovered` when a
//! call works again; at most one warning a second, and one recovery, for
//! all the breakers built from one [`FleetConfig`](crate::FleetConfig),
//! such as a keyed registry's); [`StoreFailureMode::FailClosed`] rejects
//! instead.
//! An opening whose write-through failed is written again at the first
//! read that finds the store without it, so sharing resumes by itself.
//! Timeouts of store calls belong to each store implementation
//! (`tower_breaker_redis::RedisStore` bounds each one, 50 ms by
//! default); the breaker itself bounds an election by the half-open
//! wait.
//!
//! # Example
//!
//! Two breakers, as two processes would have, share one [`MemoryStore`]:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower_breaker::store::MemoryStore;
//! use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome, State};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let store = Arc::new(MemoryStore::new());
//! let config = BreakerConfig::new()
//!     .count_window(2)
//!     .minimum_calls(2)
//!     .fleet(FleetConfig::new(store.clone()).refresh_interval(Duration::from_millis(100)));
//! let a = Breaker::with_config("payments", config.clone());
//! let b = Breaker::with_config("payments", config);
//!
//! for _ in 0..2 {
//!     a.try_acquire().unwrap().record(Outcome::Failure);
//! }
//! assert_eq!(a.snapshot().state, State::Open);
//! tokio::task::yield_now().await; // the write-through runs
//!
//! // `b` never saw a failure; after its next read it rejects too.
//! tokio::time::advance(Duration::from_millis(150)).await;
//! let _ = b.try_acquire(); // notices the interval is over, reads
//! tokio::task::yield_now().await;
//! assert!(b.try_acquire().is_err());
//! # }
//! ```

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::BoxError;

/// The future of a [`Store`] call.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The shared decision of a circuit: open until when, and who probes.
///
/// Every method takes the breaker's name (implementations namespace their
/// keys as they like) and works with *durations relative to the store's own
/// clock*, never absolute times, so that processes with skewed clocks agree.
/// Each method must be atomic in the store (a conditional write, a
/// server-side script).
///
/// # The contract
///
/// The methods below state it, clause by clause; the crate
/// [`tower-breaker-conformance`](https://docs.rs/tower-breaker-conformance)
/// makes each clause a test, run on every store of this workspace against
/// its real server, and on a store of your own as a dev-dependency:
/// `tower_breaker_conformance::tests!(your_fixture)`.
///
/// The trait is object safe and is used as `Arc<dyn Store>`; its methods
/// return boxed futures, which is fine because they are called only on
/// rare paths.
///
/// # Example
///
/// A store that is always down; the breaker fails open around it:
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::{Decision, Election, ProbeToken, Store, StoreError, StoreFuture};
///
/// #[derive(Debug)]
/// struct Down;
///
/// impl Store for Down {
///     fn try_open<'a>(&'a self, _: &'a str, _: Duration) -> StoreFuture<'a, Duration> {
///         Box::pin(async { Err(StoreError::new("down")) })
///     }
///     fn try_acquire_probe<'a>(&'a self, _: &'a str, _: Duration, _: Duration) -> StoreFuture<'a, Election> {
///         Box::pin(async { Err(StoreError::new("down")) })
///     }
///     fn close<'a>(&'a self, _: &'a str, _: ProbeToken) -> StoreFuture<'a, bool> {
///         Box::pin(async { Err(StoreError::new("down")) })
///     }
///     fn read<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Decision> {
///         Box::pin(async { Err(StoreError::new("down")) })
///     }
/// }
/// ```
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Opens the circuit for `open_for`, unless it is already open until a
    /// later time: sets T = now + `open_for` only if there is no record or
    /// its T has passed, so concurrent openers never push T forward.
    /// Returns the time left until the effective T (the existing one or the
    /// new one).
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration>;

    /// Elects the fleet's prober. When T has passed and no prober holds a
    /// lease, exactly one caller wins: T moves forward to now + `open_for`
    /// (the period the circuit stays open if the probe fails), the winner
    /// holds a lease of `lease` (the longest its probe may take; no other
    /// caller wins before it ends, even past T) and gets a token for
    /// [`close`](Store::close) and [`reopen`](Store::reopen). While T or
    /// the lease is in the future, callers lose and learn the time left.
    /// A circuit marked closed is closed; a record that is missing (lost
    /// while the caller knew the circuit open) is won like an expired one.
    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election>;

    /// Closes the circuit after a successful probe: marks it closed only if
    /// the record still holds `token` (nobody re-opened or re-elected
    /// since). The mark is kept for a while, so a record that vanished is
    /// not mistaken for a closed circuit ([`Decision::Missing`]). Returns
    /// whether it closed.
    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool>;

    /// Reads the decision, for the per-process cache.
    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision>;

    /// Re-opens after the probe of the election `token` won failed (or
    /// never completed): if the record still holds `token`, T becomes
    /// now + `open_for` (never earlier than the T the election wrote), the
    /// lease ends, and the fleet's count of re-opens in a row goes up by
    /// one, so the next prober, in whatever process, learns it from its
    /// [`ProbeToken`]. Otherwise nothing is written (fenced: a stale
    /// prober must not re-open a circuit the fleet closed or re-elected
    /// since). Returns the time left until the effective T (zero when the
    /// circuit is not open), which is what the next [`read`](Store::read)
    /// tells.
    ///
    /// The default implementation is [`try_open`](Store::try_open), which
    /// is not fenced: implement it.
    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        let _ = token;
        self.try_open(name, open_for)
    }

    /// Renews the lease of the election `token` won, while its probe runs
    /// (a heartbeat, as a lock client's): if the record still holds
    /// `token`, the lease ends `lease` from now. Returns the token to use
    /// from now on (the same one, or a fresh one for a store whose
    /// contenders time the lease from the last change they saw), or `None`
    /// when fenced (the lease had lapsed and the fleet re-elected, closed
    /// or re-opened since).
    ///
    /// A store that implements it says so with
    /// [`renews_leases`](Store::renews_leases); breakers then ask for
    /// short leases ([`FleetConfig::probe_lease`](crate::FleetConfig::probe_lease),
    /// 2 s) and renew them, so that a prober that dies or freezes frees the
    /// fleet within one lease while a slow live probe keeps it. The default
    /// fails: a store without it gets leases as long as the whole probe
    /// ([`max_half_open_wait`](crate::BreakerConfig::max_half_open_wait)).
    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        let _ = (name, token, lease);
        Box::pin(async { Err(StoreError::new("this store does not renew probe leases")) })
    }

    /// Whether [`renew_probe`](Store::renew_probe) works (false by
    /// default).
    fn renews_leases(&self) -> bool {
        false
    }

    /// Gives back the probe the election `token` won, unused: the elected
    /// process had no call to probe with (a quiet process, a caller that
    /// gave up while it waited for the election). If the record still
    /// holds `token`, the circuit stays open with its period over and no
    /// lease (T and the lease end now, the count of re-opens is kept: no
    /// probe failed), so the next candidate wins at once. Returns whether
    /// it was given back (false when fenced, or when the store cannot).
    ///
    /// The default gives nothing back (`Ok(false)`): the fleet then waits
    /// for the election's T and the lease's end, as for a prober that
    /// died.
    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        let _ = (name, token);
        Box::pin(async { Ok(false) })
    }

    /// Adds this process's outcomes since its last report to the fleet's
    /// window of `name`, opens the circuit (as [`try_open`](Store::try_open)
    /// would, for `rule.open_for`) if the fleet's window now breaks `rule`,
    /// and returns the decision, as [`read`](Store::read) does. The fleet's
    /// window is `rule.buckets` buckets of `rule.bucket` of the store's
    /// clock; it starts empty again when the circuit opens, when a prober
    /// is elected and when the circuit closes, so that evidence from
    /// before those never counts in the next closed period. Reports while
    /// the circuit is open are not evidence.
    ///
    /// When [`rule.count_window`](FleetRule::count_window) is set (the
    /// breaker counts its own calls), the fleet's window is instead its
    /// newest `count_window` calls, placed in time by
    /// [`Report::segments`] (a report's failures in a row at its end after
    /// the rest) and judged by [`FleetRule::judge_segments`]; parts placed
    /// before the buckets' span, or beyond the newest calls, are dropped.
    /// So a burst of failures after healthy traffic trips the fleet after
    /// about `count_window` times the failure rate failures *fleet-wide*,
    /// where the buckets would hold the whole fleet's healthy history.
    ///
    /// A report that fails with an error marked
    /// [`not_applied`](StoreError::not_applied) is sent again, added to the
    /// breaker's next one; mark only errors that certainly left the store
    /// unchanged, or the fleet's window counts those outcomes twice. Any
    /// other error drops the report's outcomes.
    ///
    /// The default implementation ignores the report and reads: a store
    /// without it shares decisions, not evidence.
    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> StoreFuture<'a, Decision> {
        let _ = (report, rule);
        self.read(name)
    }

    /// Claims one retry of the fleet's retry budget of `name` under `rule`
    /// ([`BudgetRule`]): `true`, and the claim is counted in the current
    /// epoch, when [`BudgetRule::grants`] it (the claims of the sliding
    /// window stay within the larger of the floor and the credit the
    /// fleet's reports earned in it); `false` otherwise. Atomic: racing
    /// claims of any number of processes never grant more.
    ///
    /// The default fails (marked [`not_applied`](StoreError::not_applied)):
    /// a store without it does not share retry budgets, and each process
    /// keeps its own.
    fn claim_retry<'a>(&'a self, name: &'a str, rule: BudgetRule) -> StoreFuture<'a, bool> {
        let _ = (name, rule);
        Box::pin(async {
            Err(StoreError::new("this store does not share retry budgets").not_applied())
        })
    }

    /// Pushes the decisions of `name` to `watcher` as they change, from now
    /// on: openings (with the time left) and closes, by any process. A push
    /// shortens how late a breaker learns of the fleet's decisions; it never
    /// replaces the periodic read, because pushes can be lost (a
    /// subscriber that was disconnected, or too slow). The store keeps
    /// only a weak reference: a watcher that is gone is forgotten.
    ///
    /// The default does nothing: the breakers learn at their next read.
    fn watch(&self, name: &str, watcher: Weak<dyn Watcher>) {
        let _ = (name, watcher);
    }

    /// Checks that `name` can be stored (length, characters), so that a
    /// breaker built with a bad name is refused at construction by
    /// [`Breaker::try_with_config`](crate::Breaker::try_with_config) rather
    /// than failing at every store call. The default accepts every name.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] saying why, when the store cannot hold `name`.
    fn check_name(&self, name: &str) -> Result<(), StoreError> {
        let _ = name;
        Ok(())
    }
}

/// What a breaker does while its store fails (an error, a timeout, garbage),
/// set with
/// [`FleetConfig::on_store_failure`](crate::FleetConfig::on_store_failure).
///
/// Whatever the mode, the breaker keeps counting its own calls, opens on
/// its own window, counts each failed store call in
/// [`Totals::store_errors`](crate::snapshot::Totals::store_errors) and emits a
/// `circuit_store_failed` warning; the next successful store call ends the
/// failure by itself.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use tower_breaker::store::{MemoryStore, StoreFailureMode};
/// use tower_breaker::{BreakerConfig, FleetConfig};
///
/// let fleet = FleetConfig::new(Arc::new(MemoryStore::new()))
///     .on_store_failure(StoreFailureMode::FailClosed);
/// let config = BreakerConfig::new().fleet(fleet);
/// # let _ = config;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StoreFailureMode {
    /// Keep the local decision (the default): a closed circuit lets calls
    /// through, an open one whose election fails probes locally. The
    /// breaker protects this process alone until the store answers again.
    /// Better to miss an outage than to invent one.
    #[default]
    FailOpen,
    /// Reject the calls of a closed circuit while the last store call
    /// failed (the cached shared decision can no longer be trusted), with a
    /// [`CircuitOpen`](crate::error::CircuitOpen) whose `retry_after` is
    /// the refresh interval; an open circuit whose election fails stays
    /// open and asks again one refresh interval later. A store outage then
    /// stops all calls to a dependency that may be healthy: choose it only
    /// when calling a failing dependency is worse than not calling at all.
    FailClosed,
}

/// The result of [`Store::try_acquire_probe`].
///
/// # Example
///
/// ```
/// use tower_breaker::store::{Election, ProbeToken};
///
/// let e = Election::Won(ProbeToken::new(42));
/// assert!(matches!(e, Election::Won(t) if t.get() == 42));
/// ```
///
/// Non-exhaustive: a later version may tell more outcomes apart; a
/// breaker's match has a wildcard arm, and a store builds these variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Election {
    /// This caller probes; the token proves it to [`Store::close`].
    Won(ProbeToken),
    /// Someone else probes, or the circuit is still open.
    Lost {
        /// The time left until T.
        remaining: Duration,
    },
    /// The circuit is marked closed fleet-wide (a prober closed it).
    Closed,
    /// Someone else won and its probe is in flight: its lease runs for
    /// `lease` more (renewed while the probe lasts), and T is `remaining`
    /// away (zero when a slow probe has outlived it). The fleet decides
    /// again when that probe ends: a breaker asks again once both are
    /// over, and tells the callers it refuses to come back about when the
    /// lease ends, not at T.
    Probing {
        /// The time left until T.
        remaining: Duration,
        /// The time left of the prober's lease.
        lease: Duration,
    },
}

/// What a store pushes decisions to ([`Store::watch`]): every breaker
/// with a store is one.
///
/// # Example
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower_breaker::store::{Decision, Watcher};
///
/// #[derive(Default)]
/// struct Last(Mutex<Option<Decision>>);
///
/// impl Watcher for Last {
///     fn decided(self: Arc<Self>, decision: Decision) {
///         *self.0.lock().unwrap() = Some(decision);
///     }
/// }
///
/// let last = Arc::new(Last::default());
/// last.clone().decided(Decision::Closed);
/// assert_eq!(*last.0.lock().unwrap(), Some(Decision::Closed));
/// ```
pub trait Watcher: Send + Sync + 'static {
    /// The circuit's decision changed: `Open` with the time left, or
    /// `Closed`. Called on the store's thread: keep it short.
    fn decided(self: Arc<Self>, decision: Decision);

    /// Decisions may have been missed: the store's push connection was
    /// down for a while (pushes are fire-and-forget) and is back. A store
    /// calls this on each of its watchers once it pushes again, so that a
    /// quiet process (one that makes no calls, hence no periodic reads)
    /// does not keep a decision the fleet has left. Called on the store's
    /// thread: keep it short. The breaker reads the decision again, in a
    /// task of its own; the default does nothing.
    fn resync(self: Arc<Self>) {}
}

/// Outcomes one breaker counted since its last [`Store::report`].
///
/// # Example
///
/// ```
/// use tower_breaker::store::Report;
///
/// let report = Report::new(12, 7, 0);
/// assert_eq!((report.calls, report.failures, report.slow), (12, 7, 0));
/// assert!(!report.is_empty());
/// assert!(Report::default().is_empty());
/// ```
///
/// Non-exhaustive (a later version may count more kinds of outcome): read
/// its fields, build it with [`Report::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Report {
    /// Calls whose outcome was counted.
    pub calls: u64,
    /// Of them, failures.
    pub failures: u64,
    /// Of them, slow successes.
    pub slow: u64,
    /// Of the failures, those in a row at the end: the calls after this
    /// process's last success (0 when its last call succeeded).
    pub tail: u64,
    /// How long before the report the [`tail`](Self::tail) began (without
    /// a tail: how long ago the newest call was): the other calls are at
    /// least that old. A duration of the process's own clock, so that
    /// skewed clocks do not matter.
    pub tail_span: Duration,
    /// Retry credit for the fleet's retry budget, in millionths of a
    /// retry: what this process's requests since its last report earned
    /// (their number times the budget's ratio), plus the retries it was
    /// granted and did not send. Added to the current epoch of
    /// [`FleetRule::budget`] (ignored without one).
    pub credit: u64,
    /// Retries the fleet's budget granted this process
    /// ([`Store::claim_retry`]) that it did not send after all: taken off
    /// the current epoch's claims.
    pub returned: u64,
}

impl Report {
    /// A report of `calls` counted calls, `failures` of them failed and
    /// `slow` of them slow successes, with no failures in a row at its end
    /// (see [`with_tail`](Self::with_tail)).
    #[must_use]
    pub const fn new(calls: u64, failures: u64, slow: u64) -> Self {
        Self {
            calls,
            failures,
            slow,
            tail: 0,
            tail_span: Duration::ZERO,
            credit: 0,
            returned: 0,
        }
    }

    /// The same report, giving back `retries` granted retries that were
    /// not sent (see [`returned`](Self::returned)).
    #[must_use]
    pub const fn with_returned(mut self, retries: u64) -> Self {
        self.returned = retries;
        self
    }

    /// The same report, carrying `ppm` millionths of a retry of credit for
    /// the fleet's retry budget (see [`credit`](Self::credit)).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::store::Report;
    ///
    /// // 30 requests at a 10% ratio earned three retries.
    /// let report = Report::new(30, 0, 0).with_credit(3_000_000);
    /// assert_eq!(report.credit, 3_000_000);
    /// ```
    #[must_use]
    pub const fn with_credit(mut self, ppm: u64) -> Self {
        self.credit = ppm;
        self
    }

    /// The same report, whose last `tail` calls are failures in a row
    /// that began `span` ago (capped at its failures); with a `tail` of 0,
    /// whose newest call was `span` ago. A fleet's count
    /// window places them after everything else this report holds, so
    /// that the healthy calls a process made before an outage never count
    /// as newer than the failures other processes reported meanwhile.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::store::{Report, Segment};
    ///
    /// // 49 successes, then one failure, the last 20 ms ago.
    /// let report = Report::new(50, 1, 0).with_tail(1, Duration::from_millis(20));
    /// let parts: Vec<Segment> = report.segments(1_000).collect();
    /// assert_eq!(parts.len(), 2);
    /// assert_eq!((parts[0].at_ms, parts[0].calls, parts[0].failures), (980, 49, 0));
    /// assert_eq!((parts[1].at_ms, parts[1].calls, parts[1].failures), (1_000, 1, 1));
    /// ```
    #[must_use]
    pub const fn with_tail(mut self, tail: u64, span: Duration) -> Self {
        self.tail = if tail < self.failures {
            tail
        } else {
            self.failures
        };
        self.tail_span = span;
        self
    }

    /// The parts this report adds to a fleet's count window when it
    /// arrives at `now_ms` of the store's clock: its
    /// [`tail`](Self::tail) at `now_ms`, the rest at `now_ms` less the
    /// [`tail_span`](Self::tail_span) (one part when either is empty).
    /// `tail` is capped at the failures.
    pub fn segments(&self, now_ms: u64) -> impl Iterator<Item = Segment> {
        let tail = self.tail.min(self.failures).min(self.calls);
        let span = u64::try_from(self.tail_span.as_millis()).unwrap_or(u64::MAX);
        let rest = Segment {
            at_ms: now_ms.saturating_sub(span),
            calls: self.calls - tail,
            failures: self.failures - tail,
            slow: self.slow.min(self.calls - tail),
        };
        let tail = Segment {
            at_ms: now_ms,
            calls: tail,
            failures: tail,
            slow: 0,
        };
        [rest, tail].into_iter().filter(|s| s.calls > 0)
    }

    /// Whether there is nothing to report.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.calls == 0
    }
}

/// When the fleet's window opens the circuit: the breaker's thresholds,
/// applied to the whole fleet's outcomes by [`Store::report`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::FleetRule;
///
/// // 10 buckets of 1 s, open for 5 s once 10 calls are in and half fail.
/// let rule = FleetRule::new(10, Duration::from_secs(1), Duration::from_secs(5))
///     .with_minimum_calls(10)
///     .with_failure_rate_ppm(500_000);
/// assert!(rule.breaks(10, 5, 0));
/// assert!(!rule.breaks(9, 9, 0), "below the minimum");
/// assert!(!rule.breaks(10, 4, 0));
/// assert_eq!(rule.slow_rate_ppm, 0, "slow calls are not judged");
/// ```
///
/// Non-exhaustive (a later version may judge more): read its fields, build
/// it with [`FleetRule::new`] and the `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetRule {
    /// Buckets in the window.
    pub buckets: u32,
    /// The length of one bucket.
    pub bucket: Duration,
    /// The fleet's calls in the window before it is judged.
    pub minimum_calls: u64,
    /// Open when failures / calls reaches this, in millionths.
    pub failure_rate_ppm: u64,
    /// Open when slow / calls reaches this, in millionths (0: slow calls
    /// are not judged).
    pub slow_rate_ppm: u64,
    /// How long the circuit opens for.
    pub open_for: Duration,
    /// When not zero, the fleet judges its newest `count_window` calls
    /// (ordered by [`Report::segments`]) within the buckets' span, instead
    /// of every call in the buckets: the fleet's count window, for
    /// breakers that count their own calls.
    pub count_window: u64,
    /// The fleet's retry budget, when a retry layer shares one through
    /// this breaker: the epochs in which a report's
    /// [`credit`](Report::credit) is added.
    pub budget: Option<BudgetRule>,
}

/// A fleet's retry budget, as a store keeps it: its claims
/// ([`Store::claim_retry`]) and the credit its requests earned
/// ([`Report::credit`]), counted in epochs of `window` of the store's
/// clock, and judged over a sliding window of that length: the current
/// epoch, plus the previous one weighted by the share of it that the
/// window still covers. A claim is granted when the window's claims stay
/// within the larger of the `floor` and its credit.
///
/// The floor is one small amount for the whole fleet (a quiet fleet may
/// still retry), not one per process.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::BudgetRule;
///
/// let rule = BudgetRule::new(Duration::from_secs(10), 2);
/// assert_eq!(rule.epoch(25_000), 2);
/// // At the start of an epoch: the floor grants two retries...
/// assert!(rule.grants(20_000, (1, 0), (0, 0)));
/// assert!(!rule.grants(20_000, (2, 0), (0, 0)));
/// // ...and 100 requests at 10% earned ten.
/// assert!(rule.grants(20_000, (9, 10_000_000), (0, 0)));
/// assert!(!rule.grants(20_000, (10, 10_000_000), (0, 0)));
/// // Halfway through the next epoch, half of that still counts: five
/// // retries, of which two were claimed in this epoch.
/// assert!(rule.grants(35_000, (2, 0), (0, 10_000_000)));
/// assert!(!rule.grants(35_000, (5, 0), (0, 10_000_000)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetRule {
    /// The length of an epoch, and of the sliding window.
    pub window: Duration,
    /// Retries the fleet may make in a window whatever its requests.
    pub floor: u64,
}

impl BudgetRule {
    /// Epochs of `window` (at least a millisecond) with a floor of `floor`
    /// retries.
    #[must_use]
    pub const fn new(window: Duration, floor: u64) -> Self {
        Self { window, floor }
    }

    /// The length of an epoch in milliseconds (at least 1).
    #[must_use]
    pub fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The epoch of `now_ms` (milliseconds of the store's clock).
    #[must_use]
    pub fn epoch(&self, now_ms: u64) -> u64 {
        now_ms / self.window_ms()
    }

    /// The weight of the previous epoch at `now_ms`, in millionths: the
    /// share of it that the sliding window still covers.
    #[must_use]
    pub fn previous_weight_ppm(&self, now_ms: u64) -> u64 {
        let window = self.window_ms();
        let elapsed = u128::from(now_ms % window) * u128::from(PPM) / u128::from(window);
        PPM - u64::try_from(elapsed).unwrap_or(PPM)
    }

    /// Whether one more retry is granted at `now_ms`, with `current` and
    /// `previous` the (claims, credit earned in millionths) of the epoch of
    /// `now_ms` and of the one before.
    #[must_use]
    pub fn grants(&self, now_ms: u64, current: (u64, u64), previous: (u64, u64)) -> bool {
        let weight = u128::from(self.previous_weight_ppm(now_ms));
        let ppm = u128::from(PPM);
        // Both sides in millionths of a retry.
        let claims = u128::from(current.0) * ppm + u128::from(previous.0) * weight;
        let earned = u128::from(current.1) + u128::from(previous.1) * weight / ppm;
        claims + ppm <= (u128::from(self.floor) * ppm).max(earned)
    }
}

/// Millionths.
const PPM: u64 = 1_000_000;

/// A part of a [`Report`] placed at a time of the store's clock, as a
/// fleet's count window keeps it ([`Report::segments`],
/// [`FleetRule::judge_segments`]).
///
/// Non-exhaustive: read its fields, build it with [`Segment::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Segment {
    /// Where it is placed, in milliseconds of the store's clock.
    pub at_ms: u64,
    /// Its calls.
    pub calls: u64,
    /// Of them, failures.
    pub failures: u64,
    /// Of them, slow successes.
    pub slow: u64,
}

impl Segment {
    /// A part of `calls` calls (`failures` of them failed, `slow` of them
    /// slow) placed at `at_ms`.
    #[must_use]
    pub const fn new(at_ms: u64, calls: u64, failures: u64, slow: u64) -> Self {
        Self {
            at_ms,
            calls,
            failures,
            slow,
        }
    }
}

impl FleetRule {
    /// A window of `buckets` buckets of `bucket` each, opening the circuit
    /// for `open_for`; it judges from the first call
    /// ([`with_minimum_calls`](Self::with_minimum_calls)), at 50% failures
    /// ([`with_failure_rate_ppm`](Self::with_failure_rate_ppm)), and not on
    /// slow calls ([`with_slow_rate_ppm`](Self::with_slow_rate_ppm)).
    #[must_use]
    pub const fn new(buckets: u32, bucket: Duration, open_for: Duration) -> Self {
        Self {
            buckets,
            bucket,
            minimum_calls: 1,
            failure_rate_ppm: 500_000,
            slow_rate_ppm: 0,
            open_for,
            count_window: 0,
            budget: None,
        }
    }

    /// Add reports' retry credit to the epochs of `rule`: see
    /// [`budget`](Self::budget).
    #[must_use]
    pub const fn with_budget(mut self, rule: BudgetRule) -> Self {
        self.budget = Some(rule);
        self
    }

    /// Judge the fleet's newest `calls` calls (0: every call in the
    /// buckets): see [`count_window`](Self::count_window).
    #[must_use]
    pub const fn with_count_window(mut self, calls: u64) -> Self {
        self.count_window = calls;
        self
    }

    /// The span of the buckets, in milliseconds: no evidence older than
    /// this counts, also in a count window.
    #[must_use]
    pub fn span_ms(&self) -> u64 {
        let bucket = u64::try_from(self.bucket.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        bucket.saturating_mul(u64::from(self.buckets.max(1)))
    }

    /// The fleet's count window over `segments` at `now_ms`: sorts them
    /// newest first, sums the newest [`count_window`](Self::count_window)
    /// calls (the oldest part counted in proportion, its failures rounded
    /// down) among those placed within [`span_ms`](Self::span_ms) of
    /// `now_ms`, and returns the sums with the number of segments that
    /// count. The segments after that number (older, or beyond the
    /// window) count no more: a store removes them.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::store::{FleetRule, Segment};
    ///
    /// let rule = FleetRule::new(10, Duration::from_secs(1), Duration::from_secs(5))
    ///     .with_count_window(20)
    ///     .with_minimum_calls(10);
    /// // 3,000 healthy calls, then ten processes' first failures.
    /// let mut segments = vec![Segment::new(1_000, 3_000, 0, 0)];
    /// for i in 0..10 {
    ///     segments.push(Segment::new(1_990, 5, 0, 0));
    ///     segments.push(Segment::new(2_000 + i, 1, 1, 0));
    /// }
    /// let (sums, keep) = rule.judge_segments(&mut segments, 2_010);
    /// assert_eq!((sums.calls, sums.failures), (20, 10));
    /// assert!(rule.breaks(sums.calls, sums.failures, sums.slow));
    /// assert_eq!(keep, 12, "ten failures, and the two newest healthy parts");
    /// ```
    pub fn judge_segments(&self, segments: &mut [Segment], now_ms: u64) -> (Segment, usize) {
        segments.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then(b.failures.cmp(&a.failures)));
        let oldest = now_ms.saturating_sub(self.span_ms());
        let window = if self.count_window == 0 {
            u64::MAX
        } else {
            self.count_window
        };
        let mut sums = Segment::new(now_ms, 0, 0, 0);
        let mut keep = 0;
        for s in segments.iter() {
            if sums.calls >= window || s.at_ms < oldest {
                break;
            }
            keep += 1;
            let take = s.calls.min(window - sums.calls);
            if take == s.calls {
                sums.failures += s.failures;
                sums.slow += s.slow;
            } else if s.calls > 0 {
                sums.failures += mul_div(s.failures, take, s.calls);
                sums.slow += mul_div(s.slow, take, s.calls);
            }
            sums.calls += take;
        }
        (sums, keep)
    }

    /// The fleet's calls in the window before it is judged.
    #[must_use]
    pub const fn with_minimum_calls(mut self, calls: u64) -> Self {
        self.minimum_calls = calls;
        self
    }

    /// Open when failures / calls reaches `ppm` millionths.
    #[must_use]
    pub const fn with_failure_rate_ppm(mut self, ppm: u64) -> Self {
        self.failure_rate_ppm = ppm;
        self
    }

    /// Open when slow / calls reaches `ppm` millionths (0: slow calls are
    /// not judged).
    #[must_use]
    pub const fn with_slow_rate_ppm(mut self, ppm: u64) -> Self {
        self.slow_rate_ppm = ppm;
        self
    }

    /// Whether a window of `calls` calls, `failures` failures and `slow`
    /// slow calls breaks the rule.
    #[must_use]
    pub fn breaks(&self, calls: u64, failures: u64, slow: u64) -> bool {
        calls > 0
            && calls >= self.minimum_calls
            && (failures * 1_000_000 >= self.failure_rate_ppm * calls
                || (self.slow_rate_ppm > 0 && slow * 1_000_000 >= self.slow_rate_ppm * calls))
    }
}

/// `a * b / c`, rounded down, without overflow (`b <= c`).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

/// The result of [`Store::read`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::Decision;
///
/// let d = Decision::Open { remaining: Duration::from_secs(3) };
/// assert_ne!(d, Decision::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// A prober closed the circuit (the record says so).
    Closed,
    /// No record: the circuit was never opened, or its record was lost
    /// (a restart without persistence, a failover, an eviction). A breaker
    /// that knows the circuit open keeps its opening and writes it again;
    /// the others stay closed.
    Missing,
    /// Open for `remaining` more.
    Open {
        /// The time left until T.
        remaining: Duration,
    },
    /// A record whose T has passed: a probe may be elected.
    Expired,
    /// Open, and the prober the fleet elected is probing: its lease runs
    /// for `lease` more (renewed while the probe lasts), T is `remaining`
    /// away (zero when a slow probe has outlived it). The fleet's decision
    /// changes when that probe ends, which is usually long before T (T is
    /// where the circuit re-opens to, should the probe fail): a breaker
    /// tells the callers it refuses to come back about when the lease
    /// ends. A store that cannot tell answers [`Open`](Self::Open).
    Probing {
        /// The time left until T.
        remaining: Duration,
        /// The time left of the prober's lease.
        lease: Duration,
    },
}

/// Proof of winning a probe election, handed back to [`Store::close`] or
/// [`Store::reopen`]. Its value is up to the store (a counter, a random
/// number); it also carries the fleet's count of re-opens in a row before
/// this election, from which the winner grows the open period should its
/// probe fail.
///
/// # Example
///
/// ```
/// use tower_breaker::store::ProbeToken;
///
/// assert_eq!(ProbeToken::new(7).get(), 7);
/// assert_eq!(ProbeToken::new(7).reopens(), 0);
/// assert_eq!(ProbeToken::new(7).with_reopens(2).reopens(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeToken {
    value: u64,
    reopens: u32,
}

/// A store call failed. The breaker then fails open: it keeps its local
/// decision.
///
/// # Example
///
/// ```
/// use tower_breaker::store::StoreError;
///
/// let e = StoreError::new("connection refused");
/// assert_eq!(e.to_string(), "circuit store failed: connection refused");
/// ```
#[derive(Debug)]
pub struct StoreError {
    message: String,
    source: Option<BoxError>,
    not_applied: bool,
}

/// The default time a store keeps a record after its T (the end of its
/// opening): 10 minutes. Cleanup only: the state is decided by comparing T
/// with the clock, never by whether the record exists.
pub const DEFAULT_CLEANUP_AFTER: Duration = Duration::from_secs(600);

/// How many freezes [`within`] leaves out of a call's time.
const MAX_THAWS: u32 = 3;
/// The steps [`within`] times a call in.
const WITHIN_STEPS: u32 = 10;
/// How much later than due a step of [`within`] may end and still count
/// as run time (a busy machine), beyond twice its length.
const WITHIN_SLACK: Duration = Duration::from_millis(10);

/// A store call's timeout that a frozen process does not lapse: runs
/// `call` until it answers or `timeout` has passed, as
/// [`tokio::time::timeout`] does, except that time the process did not
/// run is not counted. The timeout is timed in ten steps; a step whose
/// timer fired much later than due (more than twice its length, plus
/// 10 ms) spanned a freeze: AWS Lambda froze the process between
/// invocations, a debugger or `SIGSTOP` stopped it, the machine was
/// suspended. The store had no chance to answer meanwhile, so that step
/// does not count (for up to three freezes a call): the call still has the
/// rest of its timeout once thawed, however short the freeze.
///
/// Without it, a call in flight when a process is frozen fails as soon
/// as the process is thawed: a report of outcomes that may never have
/// reached the store counts as "maybe applied", and is lost. A store
/// implementation bounds its calls with this.
///
/// # Errors
///
/// [`TimedOut`] when the call did not answer in time.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::within;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let quick = within(Duration::from_millis(50), async { 7 }).await;
/// assert_eq!(quick.unwrap(), 7);
/// let slow = within(Duration::from_millis(50), std::future::pending::<()>()).await;
/// assert_eq!(slow.unwrap_err().after(), Duration::from_millis(50));
/// # }
/// ```
pub async fn within<F: Future>(timeout: Duration, call: F) -> Result<F::Output, TimedOut> {
    let mut call = std::pin::pin!(call);
    let step = (timeout / WITHIN_STEPS).max(Duration::from_millis(1));
    let mut counted = Duration::ZERO;
    let mut thaws = 0;
    loop {
        let left = timeout.saturating_sub(counted).min(step);
        let started = Instant::now();
        match tokio::time::timeout(left, call.as_mut()).await {
            Ok(output) => return Ok(output),
            Err(_) => {
                let took = started.elapsed();
                if took > left * 2 + WITHIN_SLACK && thaws < MAX_THAWS {
                    // Frozen meanwhile: not run time.
                    thaws += 1;
                    continue;
                }
                counted += took.max(left);
                if counted >= timeout {
                    return Err(TimedOut { after: timeout });
                }
            }
        }
    }
}

/// The error of [`within`]: the call did not answer within its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut {
    after: Duration,
}

impl TimedOut {
    /// The timeout that passed.
    #[must_use]
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no answer within {:?}", self.after)
    }
}

impl Error for TimedOut {}

/// `name` as a store with a length limit keeps it: unchanged up to
/// `max_len` bytes; a longer name (a keyed breaker's route or URL, say)
/// becomes its first bytes, cut on a character boundary, then `#` and the
/// 16 hexadecimal digits of a 64-bit FNV-1a hash of the whole name, in
/// `max_len` bytes at most. Every process computes the same form, so
/// long names share their circuit like short ones instead of being
/// refused (which, failing closed, refused their calls for good). Two
/// long names share a circuit only if they share the kept bytes and the
/// hash. (Below 17 bytes, `max_len` is too short for the hash: the form
/// is then the 17 bytes of `#` and the hash.)
///
/// # Example
///
/// ```
/// use tower_breaker::store::bounded_name;
///
/// assert_eq!(bounded_name("payments", 200), "payments");
/// let long = format!("/search?q={}", "x".repeat(300));
/// let kept = bounded_name(&long, 200);
/// assert_eq!(kept.len(), 200);
/// assert!(kept.starts_with("/search?q=xxx"));
/// assert_eq!(kept, bounded_name(&long, 200), "the same in every process");
/// assert_ne!(kept, bounded_name(&format!("{long}y"), 200));
/// ```
#[must_use]
pub fn bounded_name(name: &str, max_len: usize) -> std::borrow::Cow<'_, str> {
    if name.len() <= max_len {
        return std::borrow::Cow::Borrowed(name);
    }
    // FNV-1a, 64 bits: stable across processes, builds and platforms.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut keep = max_len.saturating_sub(17);
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    std::borrow::Cow::Owned(format!("{}#{hash:016x}", &name[..keep]))
}

/// Tokens that no other call of any process is likely to draw: a random
/// per-store seed hashed with a counter. The shared stores use them for
/// their versions and probe tokens; a store of your own can too.
///
/// # Example
///
/// ```
/// use tower_breaker::store::Tokens;
///
/// let tokens = Tokens::new();
/// assert_ne!(tokens.draw(), tokens.draw());
/// ```
#[derive(Debug)]
pub struct Tokens {
    seed: std::collections::hash_map::RandomState,
    next: AtomicU64,
}

impl Default for Tokens {
    fn default() -> Self {
        Self::new()
    }
}

impl Tokens {
    /// A source of tokens with a seed of its own.
    #[must_use]
    pub fn new() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new(),
            next: AtomicU64::new(0),
        }
    }

    /// The next token.
    pub fn draw(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.seed.build_hasher();
        hasher.write_u64(self.next.fetch_add(1, Relaxed));
        hasher.finish()
    }
}

/// A process-local [`Store`]: a mutex-guarded map from breaker name to its
/// record, with times from [`tokio::time::Instant`].
///
/// It is the reference implementation of the store semantics, and lets
/// several breakers of one process (one per tenant, say, or tests standing
/// for several processes) act as one circuit. The mutex is taken only on
/// the store's rare paths.
///
/// Records are forgotten [`cleanup_after`](MemoryStore::cleanup_after)
/// past their T (10 minutes by default, like the Redis store's time to
/// live): a sweep runs at most once per quarter of that time, inside a
/// store call, so the map holds only the breakers opened recently, however
/// many names come and go.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::store::{Decision, Election, MemoryStore, Store};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let secs = Duration::from_secs;
/// assert_eq!(store.try_open("db", secs(5)).await.unwrap(), secs(5));
/// // A second opener does not push T forward.
/// assert_eq!(store.try_open("db", secs(60)).await.unwrap(), secs(5));
///
/// tokio::time::advance(secs(5)).await;
/// assert_eq!(store.read("db").await.unwrap(), Decision::Expired);
/// // The winner's lease (30 s) covers its probe, past the new T (10 s).
/// let Election::Won(token) = store.try_acquire_probe("db", secs(10), secs(30)).await.unwrap() else {
///     panic!("the first caller wins")
/// };
/// tokio::time::advance(secs(12)).await;
/// assert_eq!(
///     store.try_acquire_probe("db", secs(10), secs(30)).await.unwrap(),
///     Election::Probing { remaining: Duration::ZERO, lease: secs(18) }
/// );
/// assert!(store.close("db", token).await.unwrap());
/// assert_eq!(store.read("db").await.unwrap(), Decision::Closed);
/// # }
/// ```
pub struct MemoryStore {
    base: Instant,
    records: Mutex<Records>,
    watchers: Mutex<Watchers>,
    tokens: AtomicU64,
    cleanup_after: Duration,
}

/// The memory store's watchers: per name, the breakers told of its
/// decisions. Names whose breakers are all gone (a keyed registry's evicted
/// keys) are forgotten by a sweep each time the map doubles, so the map
/// stays within twice the names watched by living breakers.
#[derive(Default)]
struct Watchers {
    map: HashMap<String, Vec<Weak<dyn Watcher>>>,
    /// The map's size that triggers the next sweep.
    sweep_at: usize,
}

impl Watchers {
    fn sweep(&mut self) {
        if self.map.len() < self.sweep_at.max(64) {
            return;
        }
        self.map.retain(|_, list| {
            list.retain(|w| w.strong_count() > 0);
            !list.is_empty()
        });
        self.sweep_at = self.map.len().saturating_mul(2);
    }
}

struct Records {
    map: HashMap<String, Record>,
    /// The fleet's windows: per name, one slot per bucket, each holding
    /// the bucket's index and its calls, failures and slow calls.
    windows: HashMap<String, Vec<[u64; 4]>>,
    /// The fleet's count windows: per name, the parts of the reports
    /// that still count, newest first.
    segments: HashMap<String, Vec<Segment>>,
    /// The fleets' retry budgets: per name, the current and the previous
    /// epoch.
    budgets: HashMap<String, [Epoch; 2]>,
    /// When the next sweep of records long past their T is due.
    next_sweep: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// False once a prober closed the circuit (the mark is kept).
    open: bool,
    until: Instant,
    token: u64,
    /// Re-opens in a row after failed probes.
    reopens: u32,
    /// The length of the current opening.
    period: Duration,
    /// Until when the elected prober may probe (`until` or earlier: none).
    lease: Instant,
}

/// One epoch of a fleet's retry budget in the memory store.
#[derive(Debug, Clone, Copy, Default)]
struct Epoch {
    epoch: u64,
    /// When it was last written, for the sweep.
    at_ms: u64,
    claims: u64,
    earned: u64,
}

impl Epoch {
    /// The epoch of `now_ms` in `epochs` (current, previous), moving the
    /// pair on when the current one is over.
    fn current(epochs: &mut [Epoch; 2], rule: BudgetRule, now_ms: u64) -> &mut Epoch {
        let epoch = rule.epoch(now_ms);
        if epochs[0].epoch != epoch || epochs[0].at_ms == 0 {
            let fresh = Epoch {
                epoch,
                at_ms: now_ms.max(1),
                claims: 0,
                earned: 0,
            };
            let old = std::mem::replace(&mut epochs[0], fresh);
            epochs[1] = if old.at_ms > 0 && old.epoch + 1 == epoch {
                old
            } else {
                Epoch::default()
            };
        }
        epochs[0].at_ms = now_ms.max(1);
        &mut epochs[0]
    }
}

// === impl ProbeToken ===

impl ProbeToken {
    /// A token holding `value`, with no re-opens before it.
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Self { value, reopens: 0 }
    }

    /// The same token, saying that the fleet re-opened `reopens` times in a
    /// row (failed probes) before this election.
    #[must_use]
    pub const fn with_reopens(self, reopens: u32) -> Self {
        Self {
            value: self.value,
            reopens,
        }
    }

    /// The value it holds.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.value
    }

    /// The fleet's re-opens in a row before this election.
    #[must_use]
    pub const fn reopens(self) -> u32 {
        self.reopens
    }
}

// === impl StoreError ===

impl StoreError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
            not_applied: false,
        }
    }

    /// An error with a message and the underlying error.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
            not_applied: false,
        }
    }

    /// This error, known to have left the store unchanged: the call never
    /// reached it (a refused connection) or was refused before it ran
    /// (throttling, a missing table, a permission). A breaker whose
    /// [report](Store::report) fails this way reports the same outcomes
    /// again with its next one; after any other error (a timeout, a
    /// connection lost mid-call) the store may have counted them, and
    /// they are not sent twice.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::store::StoreError;
    ///
    /// let refused = StoreError::new("connection refused").not_applied();
    /// assert!(refused.is_not_applied());
    /// assert!(!StoreError::new("timed out").is_not_applied());
    /// ```
    #[must_use]
    pub fn not_applied(mut self) -> Self {
        self.not_applied = true;
        self
    }

    /// Whether the store is known to be unchanged by the call that failed
    /// (see [`not_applied`](Self::not_applied)).
    #[must_use]
    pub fn is_not_applied(&self) -> bool {
        self.not_applied
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "circuit store failed: {}", self.message)
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

// === impl MemoryStore ===

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        let now = Instant::now();
        Self {
            base: now,
            records: Mutex::new(Records {
                map: HashMap::new(),
                windows: HashMap::new(),
                segments: HashMap::new(),
                budgets: HashMap::new(),
                next_sweep: now,
            }),
            tokens: AtomicU64::new(1),
            watchers: Mutex::new(Watchers::default()),
            cleanup_after: DEFAULT_CLEANUP_AFTER,
        }
    }

    /// How long a record is kept after its T (default
    /// [`DEFAULT_CLEANUP_AFTER`]). A record that is gone reads as closed,
    /// so keep it at least as long as the longest open period.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::store::{MemoryStore, Store};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let store = MemoryStore::new().cleanup_after(Duration::from_secs(60));
    /// store.try_open("db", Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(store.len(), 1);
    /// tokio::time::advance(Duration::from_secs(65)).await;
    /// store.read("other").await.unwrap(); // any call may sweep
    /// assert_eq!(store.len(), 0);
    /// # }
    /// ```
    #[must_use]
    pub fn cleanup_after(mut self, after: Duration) -> Self {
        self.cleanup_after = after;
        self
    }

    /// Forgets the record of `name`, as a store that lost its data would (a
    /// restart without persistence, a failover to a replica that had not
    /// received it, an eviction): for tests of what the fleet does then.
    /// Returns whether there was one.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_breaker::store::{Decision, MemoryStore, Store};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let store = MemoryStore::new();
    /// store.try_open("db", Duration::from_secs(5)).await.unwrap();
    /// assert!(store.remove("db"));
    /// assert_eq!(store.read("db").await.unwrap(), Decision::Missing);
    /// # }
    /// ```
    pub fn remove(&self, name: &str) -> bool {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.map.remove(name).is_some()
    }

    /// How many records the store holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.lock().map(|r| r.map.len()).unwrap_or(0)
    }

    /// Whether the store holds no record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Record>, Instant) -> T) -> T {
        self.with_all(|records, now| f(&mut records.map, now))
    }

    fn with_all<T>(&self, f: impl FnOnce(&mut Records, Instant) -> T) -> T {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now >= records.next_sweep {
            let keep = self.cleanup_after;
            records.map.retain(|_, r| r.until.max(r.lease) + keep > now);
            // A window whose newest bucket is older than the cleanup time
            // holds nothing the fleet still judges.
            let now_ms = self.ms(now);
            let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
            records.windows.retain(|_, slots| {
                slots
                    .iter()
                    .any(|s| s[0] != u64::MAX && s[0].saturating_add(keep_ms) > now_ms)
            });
            records.segments.retain(|_, parts| {
                parts
                    .iter()
                    .any(|p| p.at_ms.saturating_add(keep_ms) > now_ms)
            });
            records
                .budgets
                .retain(|_, [current, _]| current.at_ms.saturating_add(keep_ms) > now_ms);
            records.next_sweep = now + (keep / 4).max(Duration::from_secs(1));
        }
        f(&mut records, now)
    }

    /// Pushes `decision` to the watchers of `name`, outside every lock.
    fn notify(&self, name: &str, decision: Decision) {
        let alive: Vec<Arc<dyn Watcher>> = {
            let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
            let Some(list) = watchers.map.get_mut(name) else {
                return;
            };
            list.retain(|w| w.strong_count() > 0);
            let alive = list.iter().filter_map(Weak::upgrade).collect();
            if list.is_empty() {
                watchers.map.remove(name);
            }
            alive
        };
        for watcher in alive {
            watcher.decided(decision);
        }
    }

    /// Milliseconds of the store's clock.
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    fn token(&self) -> u64 {
        self.tokens.fetch_add(1, Relaxed)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let records = self.len();
        f.debug_struct("MemoryStore")
            .field("base", &self.base)
            .field("records", &records)
            .finish()
    }
}

impl Store for MemoryStore {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        let token = self.token();
        let result = self.with_all(|records, now| {
            // The window starts again from empty for the next closed
            // period.
            records.windows.remove(name);
            records.segments.remove(name);
            open_record(&mut records.map, name, now, open_for, token)
        });
        self.notify(name, Decision::Open { remaining: result });
        Box::pin(async move { Ok(result) })
    }

    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        let token = self.token();
        let result = self.with_all(|all, now| match all.map.get(name).copied() {
            Some(r) if !r.open => Election::Closed,
            Some(r) if r.lease > now => Election::Probing {
                remaining: r.until.saturating_duration_since(now),
                lease: r.lease - now,
            },
            Some(r) if r.until > now => Election::Lost {
                remaining: r.until - now,
            },
            previous => {
                // At least as long as the last opening, whatever this
                // caller's own idea of the period. A missing record (lost
                // while the caller knew the circuit open) is won too.
                let (reopens, last) =
                    previous.map_or((0, Duration::ZERO), |r| (r.reopens, r.period));
                let period = open_for.max(last);
                // An election starts the window empty, as an opening does:
                // evidence from before it (on a record that held only the
                // window) is not evidence after the probe.
                all.windows.remove(name);
                all.segments.remove(name);
                all.map.insert(
                    name.to_owned(),
                    Record {
                        open: true,
                        until: now + period,
                        token,
                        reopens,
                        period,
                        lease: now + lease,
                    },
                );
                Election::Won(ProbeToken::new(token).with_reopens(reopens))
            }
        });
        Box::pin(async move { Ok(result) })
    }

    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        let fresh = self.token();
        let result = self.with(|records, now| match records.get_mut(name) {
            Some(r) if r.open && r.token == token.get() => {
                r.until = r.until.max(now + open_for);
                r.token = fresh;
                r.reopens = r.reopens.saturating_add(1);
                r.period = open_for;
                r.lease = now;
                r.until - now
            }
            // Fenced: the fleet closed or re-elected since.
            Some(r) if r.open && r.until > now => r.until - now,
            _ => Duration::ZERO,
        });
        if !result.is_zero() {
            self.notify(name, Decision::Open { remaining: result });
        }
        Box::pin(async move { Ok(result) })
    }

    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        let result = self.with(|records, now| match records.get_mut(name) {
            Some(r) if r.open && r.token == token.get() => {
                r.lease = r.lease.max(now + lease);
                Some(token)
            }
            _ => None,
        });
        Box::pin(async move { Ok(result) })
    }

    fn renews_leases(&self) -> bool {
        true
    }

    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        let fresh = self.token();
        let result = self.with(|records, now| match records.get_mut(name) {
            Some(r) if r.open && r.token == token.get() => {
                r.until = now;
                r.lease = now;
                r.token = fresh;
                true
            }
            _ => false,
        });
        if result {
            self.notify(name, Decision::Expired);
        }
        Box::pin(async move { Ok(result) })
    }

    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        let result = self.with_all(|all, now| match all.map.get_mut(name) {
            Some(r) if r.open && r.token == token.get() => {
                // The mark stays until the cleanup, like an opening; the
                // next closed period's window starts empty.
                all.windows.remove(name);
                all.segments.remove(name);
                *r = Record {
                    open: false,
                    until: now,
                    token: 0,
                    reopens: 0,
                    period: Duration::ZERO,
                    lease: now,
                };
                true
            }
            _ => false,
        });
        if result {
            self.notify(name, Decision::Closed);
        }
        Box::pin(async move { Ok(result) })
    }

    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        let result = self.with(|records, now| decision(records, name, now));
        Box::pin(async move { Ok(result) })
    }

    fn watch(&self, name: &str, watcher: Weak<dyn Watcher>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        let list = watchers.map.entry(name.to_owned()).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(watcher);
        watchers.sweep();
    }

    fn claim_retry<'a>(&'a self, name: &'a str, rule: BudgetRule) -> StoreFuture<'a, bool> {
        let granted = self.with_all(|records, now| {
            let now_ms = self.ms(now);
            let epochs = records.budgets.entry(name.to_owned()).or_default();
            let current = Epoch::current(epochs, rule, now_ms);
            let counts = (current.claims, current.earned);
            let previous = &epochs[1];
            let before = match rule.epoch(now_ms).checked_sub(1) {
                Some(last) if previous.at_ms > 0 && previous.epoch == last => {
                    (previous.claims, previous.earned)
                }
                _ => (0, 0),
            };
            let granted = rule.grants(now_ms, counts, before);
            if granted {
                epochs[0].claims += 1;
            }
            granted
        });
        Box::pin(async move { Ok(granted) })
    }

    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> StoreFuture<'a, Decision> {
        let token = self.token();
        let result = self.with_all(|records, now| {
            if let Some(budget) = rule.budget.filter(|_| report.credit + report.returned > 0) {
                let now_ms = self.ms(now);
                let epochs = records.budgets.entry(name.to_owned()).or_default();
                let current = Epoch::current(epochs, budget, now_ms);
                current.earned += report.credit;
                current.claims = current.claims.saturating_sub(report.returned);
            }
            // While the circuit is open, outcomes are not evidence for the
            // next closed period (late reports of processes that had not
            // heard yet).
            if records.map.get(name).is_some_and(|r| r.open) {
                return Err(decision(&records.map, name, now));
            }
            if rule.count_window > 0 {
                let now_ms = self.ms(now);
                let segments = records.segments.entry(name.to_owned()).or_default();
                segments.extend(report.segments(now_ms));
                let (sums, keep) = rule.judge_segments(segments, now_ms);
                segments.truncate(keep);
                if rule.breaks(sums.calls, sums.failures, sums.slow) {
                    records.segments.remove(name);
                    let remaining = open_record(&mut records.map, name, now, rule.open_for, token);
                    return Ok((Decision::Open { remaining }, true));
                }
                return Ok((decision(&records.map, name, now), false));
            }
            let buckets = rule.buckets.max(1) as usize;
            let bucket_ms = u64::try_from(rule.bucket.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let tick = self.ms(now) / bucket_ms;
            let slots = records
                .windows
                .entry(name.to_owned())
                .or_insert_with(|| vec![[u64::MAX, 0, 0, 0]; buckets]);
            if slots.len() != buckets {
                *slots = vec![[u64::MAX, 0, 0, 0]; buckets];
            }
            let slot = &mut slots[(tick % buckets as u64) as usize];
            if slot[0] != tick {
                *slot = [tick, 0, 0, 0];
            }
            slot[1] += report.calls;
            slot[2] += report.failures;
            slot[3] += report.slow;
            let oldest = (tick + 1).saturating_sub(buckets as u64);
            let [calls, failures, slow] = slots
                .iter()
                .filter(|s| s[0] != u64::MAX && s[0] >= oldest && s[0] <= tick)
                .fold([0, 0, 0], |t, s| [t[0] + s[1], t[1] + s[2], t[2] + s[3]]);
            if rule.breaks(calls, failures, slow) {
                records.windows.remove(name);
                records.segments.remove(name);
                let remaining = open_record(&mut records.map, name, now, rule.open_for, token);
                return Ok((Decision::Open { remaining }, true));
            }
            Ok((decision(&records.map, name, now), false))
        });
        let (result, opened) = match result {
            Ok(pair) => pair,
            Err(decision) => (decision, false),
        };
        if opened {
            self.notify(name, result);
        }
        Box::pin(async move { Ok(result) })
    }
}

/// [`Store::read`] on the map.
fn decision(records: &HashMap<String, Record>, name: &str, now: Instant) -> Decision {
    match records.get(name) {
        None => Decision::Missing,
        Some(r) if !r.open => Decision::Closed,
        Some(r) if r.lease > now => Decision::Probing {
            remaining: r.until.saturating_duration_since(now),
            lease: r.lease - now,
        },
        Some(r) if r.until > now => Decision::Open {
            remaining: r.until - now,
        },
        Some(_) => Decision::Expired,
    }
}

/// [`Store::try_open`] on the map: open unless open until later. An expired
/// record keeps its count of re-opens (no probe has closed the circuit); a
/// closed one starts again from zero.
fn open_record(
    records: &mut HashMap<String, Record>,
    name: &str,
    now: Instant,
    open_for: Duration,
    token: u64,
) -> Duration {
    match records.get(name) {
        Some(r) if r.open && r.until > now => r.until - now,
        previous => {
            let reopens = previous.filter(|r| r.open).map_or(0, |r| r.reopens);
            records.insert(
                name.to_owned(),
                Record {
                    open: true,
                    until: now + open_for,
                    token,
                    reopens,
                    period: open_for,
                    lease: now,
                },
            );
            open_for
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nobody;

    impl Watcher for Nobody {
        fn decided(self: Arc<Self>, _decision: Decision) {}
    }

    /// Regression: the memory store kept an entry per name ever watched
    /// (a keyed registry's evicted keys grew it without bound).
    #[test]
    fn names_whose_watchers_are_all_gone_are_forgotten() {
        let store = MemoryStore::new();
        let kept: Arc<dyn Watcher> = Arc::new(Nobody);
        store.watch("kept", Arc::downgrade(&kept));
        for i in 0..10_000 {
            let gone: Arc<dyn Watcher> = Arc::new(Nobody);
            store.watch(&format!("key {i}"), Arc::downgrade(&gone));
        }
        let watchers = store.watchers.lock().unwrap();
        assert!(watchers.map.len() <= 64, "{} names", watchers.map.len());
        assert!(watchers.map.contains_key("kept"));
    }
}
