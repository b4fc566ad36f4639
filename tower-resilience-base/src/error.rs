//! One definition of each error the layers share.
//!
//! Every layer's error type is [`BoxError`]: the inner service's error,
//! unchanged, or one of the structs below. Match on them with `is` or
//! `downcast_ref`, or, when other layers may have wrapped them, with
//! [`find`], which walks the [`source`](Error::source) chain. Each layer
//! crate re-exports the errors it produces from its own `error` module, so
//! `tower_breaker::error::CircuitOpen` and
//! `tower_resilience_base::error::CircuitOpen` are the same type.
//!
//! Two families matter to the other layers:
//!
//! - **local rejections** ([`is_local_rejection`]): [`CircuitOpen`],
//!   [`BulkheadFull`], [`InsufficientBudget`], [`Throttled`] and
//!   [`LocalRejection`]. The
//!   dependency was not called; a breaker does not count them, a retry
//!   layer does not retry them.
//! - **spent retries** ([`retries_spent`]): [`AttemptsExhausted`],
//!   [`BudgetExhausted`], [`DeadlineTooClose`]. A retry layer gave up; no
//!   retry layer above retries them (retries happen in one tier only).
//!
//! ```
//! use std::time::Duration;
//! use tower_resilience_base::error::{self, AttemptsExhausted, CircuitOpen};
//! use tower_resilience_base::BoxError;
//!
//! let open: BoxError = Box::new(CircuitOpen::new("payments", Duration::from_secs(1), false));
//! assert!(open.is::<CircuitOpen>());
//! assert!(error::is_local_rejection(&*open));
//!
//! // Wrapped by a retry layer that gave up: still found, and marked spent.
//! let spent: BoxError = Box::new(AttemptsExhausted::new(3, open));
//! assert_eq!(error::find::<CircuitOpen>(&*spent).unwrap().breaker(), "payments");
//! assert!(error::retries_spent(&*spent));
//! ```

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::criticality::Criticality;
use crate::{BoxError, Name};

/// The circuit is open (or half-open with every probe slot taken, or
/// ramping up): the call was rejected without calling the inner service.
///
/// It names the breaker and says how long until the breaker will let a
/// probe through ([`retry_after`](Self::retry_after)), which HTTP answers
/// turn into `Retry-After`. Creating one does not allocate when the name is
/// an `Arc<str>` already; boxing it into a [`BoxError`] is the only
/// allocation of a rejection.
///
/// It is also what the breaker's attempt hook returns to a retry layer
/// below it to stop its retries, so the caller sees the same error whether
/// the circuit was open before the call or opened during its retries.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::error::CircuitOpen;
///
/// let open = CircuitOpen::new("payments", Duration::from_millis(1500), false);
/// assert_eq!(open.to_string(), "circuit `payments` is open, next probe in 1500 ms");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    breaker: Name,
    retry_after: Duration,
    forced: bool,
}

/// A call was refused because its bulkhead compartment was full: **local
/// overload, not a dependency failure**.
///
/// The dependency behind the compartment was not called and may be
/// perfectly healthy; this process simply has as many calls to it in flight
/// as it allows. So a circuit breaker does not count it, a retry layer does
/// not retry it (that would only add load where there is too much already),
/// and over HTTP it becomes `503 Service Unavailable` with `Retry-After`
/// and the [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER), or gRPC
/// `RESOURCE_EXHAUSTED`.
///
/// The rejection happened either at once ([`waited`](Self::waited) is zero)
/// or after the configured `max_wait` passed without a slot freeing up
/// ([`waited_and_timed_out`](Self::waited_and_timed_out)). A compartment
/// that sheds by criticality refuses a request over its criticality's
/// share of the limit before the compartment is full: that refusal says
/// which criticality it shed ([`shed`](Self::shed)).
///
/// # Example
///
/// ```
/// use tower_resilience_base::criticality::Criticality;
/// use tower_resilience_base::error::BulkheadFull;
///
/// let full = BulkheadFull::new("payments", 16, None);
/// assert_eq!(full.to_string(), "bulkhead compartment `payments` is full (16 in flight)");
/// assert_eq!(full.shed(), None);
///
/// let shed = BulkheadFull::shed_for("payments", 16, Criticality::Sheddable);
/// assert_eq!(
///     shed.to_string(),
///     "bulkhead compartment `payments` shed a `sheddable` call: over its share of the limit of 16"
/// );
/// assert_eq!(shed.shed(), Some(Criticality::Sheddable));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkheadFull {
    compartment: Name,
    limit: usize,
    waited: Option<Duration>,
    shed: Option<Criticality>,
}

/// The deadline passed while the call was in flight; the inner future was
/// dropped, which cancels the downstream work.
///
/// Retrying it is pointless when it is the caller's deadline that passed:
/// the caller's budget is spent. (A retry layer does retry it when it comes
/// from a per-attempt deadline shorter than the call's.)
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::DeadlineExceeded;
///
/// assert_eq!(DeadlineExceeded::new().to_string(), "deadline exceeded");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineExceeded {
    _p: (),
}

/// The budget left was below the configured minimum, so the inner service
/// was not called at all (fail fast).
///
/// Carries how much was left and how much was required.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_resilience_base::error::InsufficientBudget;
///
/// let e = InsufficientBudget::new(Duration::ZERO, Duration::from_millis(5));
/// assert_eq!(e.to_string(), "deadline already passed before the call");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsufficientBudget {
    remaining: Duration,
    required: Duration,
}

/// Every allowed attempt failed with a retryable error; the last one is
/// the [`source`](Error::source).
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_resilience_base::error::AttemptsExhausted;
///
/// let e = AttemptsExhausted::new(3, io::Error::from(io::ErrorKind::ConnectionRefused).into());
/// assert_eq!(e.attempts(), 3);
/// assert!(std::error::Error::source(&e).unwrap().is::<io::Error>());
/// ```
#[derive(Debug)]
pub struct AttemptsExhausted {
    attempts: u32,
    source: BoxError,
}

/// The retry budget refused the retry of a retryable error; the last
/// attempt's error is the [`source`](Error::source).
///
/// This is what callers see while a dependency is down and the budget is
/// holding the load near the request rate.
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::BudgetExhausted;
///
/// let e = BudgetExhausted::new(1, "connection refused".into());
/// assert_eq!(e.to_string(), "retry refused by the retry budget after 1 attempt: connection refused");
/// ```
#[derive(Debug)]
pub struct BudgetExhausted {
    attempts: u32,
    source: BoxError,
}

/// Not enough of the caller's deadline was left to back off and make
/// another attempt of at least the minimum slice; the last attempt's error
/// is the [`source`](Error::source).
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::DeadlineTooClose;
///
/// let e = DeadlineTooClose::new(2, "timed out".into());
/// assert_eq!(e.attempts(), 2);
/// ```
#[derive(Debug)]
pub struct DeadlineTooClose {
    attempts: u32,
    source: BoxError,
}

/// A local rejection of your own: wrap the error of a layer that refuses
/// calls on purpose (a load shedder, a rate limiter) in it, and the
/// toolkit's layers treat it like a full bulkhead: the breaker does not
/// count it, the retry layer does not retry it, and
/// [`Answer::for_error`](crate::Answer::for_error) answers 503.
///
/// The wrapped error is its [`source`](Error::source).
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::{is_local_rejection, LocalRejection};
/// use tower_resilience_base::BoxError;
///
/// let shed: BoxError = Box::new(LocalRejection::new("load shed"));
/// assert!(is_local_rejection(&*shed));
/// assert_eq!(shed.to_string(), "rejected locally: load shed");
/// ```
#[derive(Debug)]
pub struct LocalRejection {
    source: BoxError,
}

/// A call was refused by client-side adaptive throttling (the SRE book's
/// rule, `tower_breaker::throttle`): the dependency has been refusing or
/// failing so many of this client's requests that this one was dropped
/// locally, with the [`probability`](Self::probability) the throttle
/// computed for it. **A local rejection, not a dependency failure**: the
/// dependency was not called, so a breaker does not count it, a retry
/// layer does not retry it, and
/// [`Answer::for_error`](crate::Answer::for_error) answers 503 (gRPC
/// UNAVAILABLE) with the do-not-retry mark.
///
/// # Example
///
/// ```
/// use tower_resilience_base::error::{is_local_rejection, Throttled};
/// use tower_resilience_base::BoxError;
///
/// let throttled = Throttled::new("search", 0.25);
/// assert_eq!(throttled.throttle(), "search");
/// assert_eq!(throttled.to_string(), "throttled by `search` (rejecting 25.0% of requests)");
/// let e: BoxError = Box::new(throttled);
/// assert!(is_local_rejection(&*e));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Throttled {
    throttle: Name,
    probability: f64,
}

// === impl CircuitOpen ===

impl CircuitOpen {
    /// The rejection of breaker `breaker`, whose next probe is
    /// `retry_after` away; `forced` when the circuit was forced open by
    /// hand.
    ///
    /// A `breaker` name written in the source (a `&'static str`) is copied
    /// without a reference count (see [`Name`]).
    pub fn new(breaker: impl Into<Name>, retry_after: Duration, forced: bool) -> Self {
        Self {
            breaker: breaker.into(),
            retry_after,
            forced,
        }
    }

    /// The name of the breaker that rejected the call.
    #[must_use]
    pub fn breaker(&self) -> &str {
        &self.breaker
    }

    /// How long until the breaker lets a probe through: the rest of the
    /// open period; while half-open, the rest of the half-open wait; during
    /// a ramp-up, zero; when forced open, the configured open period (a
    /// hint only: a forced circuit opens when someone says so).
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// Whether the circuit was forced open by hand.
    #[must_use]
    pub fn is_forced(&self) -> bool {
        self.forced
    }
}

impl fmt::Debug for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitOpen")
            .field("breaker", &self.breaker.as_str())
            .field("retry_after", &self.retry_after)
            .field("forced", &self.forced)
            .finish()
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.forced {
            write!(f, "circuit `{}` is forced open", self.breaker)
        } else {
            write!(
                f,
                "circuit `{}` is open, next probe in {} ms",
                self.breaker,
                self.retry_after.as_millis()
            )
        }
    }
}

impl Error for CircuitOpen {}

// === impl BulkheadFull ===

impl BulkheadFull {
    /// The rejection of compartment `compartment` holding `limit` calls;
    /// `waited` is `Some(max_wait)` when the call waited in vain first.
    pub fn new(compartment: impl Into<Name>, limit: usize, waited: Option<Duration>) -> Self {
        Self {
            compartment: compartment.into(),
            limit,
            waited,
            shed: None,
        }
    }

    /// The refusal, by compartment `compartment` of limit `limit`, of a
    /// request of `criticality` that was over its criticality's share of
    /// the limit (the compartment sheds the least critical calls first,
    /// before it is full). It never waited.
    pub fn shed_for(compartment: impl Into<Name>, limit: usize, criticality: Criticality) -> Self {
        Self {
            compartment: compartment.into(),
            limit,
            waited: None,
            shed: Some(criticality),
        }
    }

    /// The criticality of the refused call when it was shed for it (over
    /// its share of the limit); `None` when the compartment was full.
    #[must_use]
    pub const fn shed(&self) -> Option<Criticality> {
        self.shed
    }

    /// The name of the full compartment: the bulkhead's name, and for
    /// keyed bulkheads the key (`name["key"]`) or `name/fallback`.
    #[must_use]
    pub fn compartment(&self) -> &str {
        &self.compartment
    }

    /// The compartment's limit: how many calls were in flight when this one
    /// was refused (for a [shed](Self::shed) call, the limit whose share it
    /// was over).
    #[must_use]
    pub const fn limit(&self) -> usize {
        self.limit
    }

    /// How long the call waited for a slot before it was refused: zero when
    /// it was refused at once, `max_wait` otherwise.
    #[must_use]
    pub fn waited(&self) -> Duration {
        self.waited.unwrap_or(Duration::ZERO)
    }

    /// Whether the call waited the whole `max_wait` in vain, rather than
    /// being refused at once. Either way the cause is the same: the
    /// compartment was full.
    #[must_use]
    pub const fn waited_and_timed_out(&self) -> bool {
        self.waited.is_some()
    }
}

impl fmt::Display for BulkheadFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(criticality) = self.shed {
            return write!(
                f,
                "bulkhead compartment `{}` shed a `{}` call: over its share of the limit of {}",
                self.compartment,
                criticality.as_str(),
                self.limit
            );
        }
        write!(
            f,
            "bulkhead compartment `{}` is full ({} in flight)",
            self.compartment, self.limit
        )?;
        if let Some(waited) = self.waited {
            write!(f, " after waiting {waited:?}")?;
        }
        Ok(())
    }
}

impl Error for BulkheadFull {}

// === impl DeadlineExceeded ===

impl DeadlineExceeded {
    /// The error of a call cut by its deadline.
    #[must_use]
    pub const fn new() -> Self {
        Self { _p: () }
    }
}

impl Default for DeadlineExceeded {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl Error for DeadlineExceeded {}

// === impl InsufficientBudget ===

impl InsufficientBudget {
    /// The refusal of a call with `remaining` left when `required` was
    /// needed.
    #[must_use]
    pub const fn new(remaining: Duration, required: Duration) -> Self {
        Self {
            remaining,
            required,
        }
    }

    /// The budget that was left when the call was refused (zero if the
    /// deadline had already passed).
    #[must_use]
    pub const fn remaining(&self) -> Duration {
        self.remaining
    }

    /// The configured minimum budget needed to start a call.
    #[must_use]
    pub const fn required(&self) -> Duration {
        self.required
    }
}

impl fmt::Display for InsufficientBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.remaining.is_zero() {
            f.write_str("deadline already passed before the call")
        } else {
            write!(
                f,
                "deadline budget too small to start the call: {:?} left, {:?} required",
                self.remaining, self.required
            )
        }
    }
}

impl Error for InsufficientBudget {}

macro_rules! spent {
    ($name:ident, $what:literal) => {
        // === impl $name ===

        impl $name {
            /// The give-up after `attempts` attempts (the first included)
            /// whose last error was `source`.
            #[must_use]
            pub fn new(attempts: u32, source: BoxError) -> Self {
                Self { attempts, source }
            }

            /// How many attempts were made, the first included.
            #[must_use]
            pub const fn attempts(&self) -> u32 {
                self.attempts
            }

            /// The last attempt's error.
            #[must_use]
            pub fn into_source(self) -> BoxError {
                self.source
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let plural = if self.attempts == 1 { "" } else { "s" };
                write!(
                    f,
                    concat!($what, " after {} attempt{}: {}"),
                    self.attempts, plural, self.source
                )
            }
        }

        impl Error for $name {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.source)
            }
        }
    };
}

spent!(AttemptsExhausted, "retries exhausted");
spent!(BudgetExhausted, "retry refused by the retry budget");
spent!(
    DeadlineTooClose,
    "no time left to retry before the deadline"
);

// === impl Throttled ===

impl Throttled {
    /// The refusal of throttle `throttle`, which rejected the call with
    /// `probability` (clamped to `0.0..=1.0`; NaN reads as 1).
    pub fn new(throttle: impl Into<Name>, probability: f64) -> Self {
        let probability = if probability.is_nan() {
            1.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        Self {
            throttle: throttle.into(),
            probability,
        }
    }

    /// The name of the throttle that refused the call.
    #[must_use]
    pub fn throttle(&self) -> &str {
        &self.throttle
    }

    /// The probability with which the throttle was rejecting calls of this
    /// call's criticality when it refused it, `0.0..=1.0`.
    #[must_use]
    pub const fn probability(&self) -> f64 {
        self.probability
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "throttled by `{}` (rejecting {:.1}% of requests)",
            self.throttle,
            self.probability * 100.0
        )
    }
}

impl Error for Throttled {}

// === impl LocalRejection ===

impl LocalRejection {
    /// Marks `error` as a local rejection.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self {
            source: error.into(),
        }
    }

    /// The wrapped error.
    #[must_use]
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for LocalRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rejected locally: {}", self.source)
    }
}

impl Error for LocalRejection {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

// === functions ===

/// The first error of type `T` in `error`'s [`source`](Error::source)
/// chain, `error` itself included.
#[must_use]
pub fn find<'a, T: Error + 'static>(error: &'a (dyn Error + 'static)) -> Option<&'a T> {
    chain(error).find_map(|e| e.downcast_ref::<T>())
}

/// Whether `error` (or an error in its source chain) is a local rejection:
/// [`CircuitOpen`], [`BulkheadFull`], [`InsufficientBudget`],
/// [`Throttled`] or [`LocalRejection`]. The dependency was not called.
#[must_use]
pub fn is_local_rejection(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        e.is::<CircuitOpen>()
            || e.is::<BulkheadFull>()
            || e.is::<InsufficientBudget>()
            || e.is::<Throttled>()
            || e.is::<LocalRejection>()
    })
}

/// Whether a retry layer already gave up on `error` (it is, or wraps,
/// [`AttemptsExhausted`], [`BudgetExhausted`] or [`DeadlineTooClose`]), so
/// no tier above should retry it.
#[must_use]
pub fn retries_spent(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        e.is::<AttemptsExhausted>() || e.is::<BudgetExhausted>() || e.is::<DeadlineTooClose>()
    })
}

/// `error` and its sources, outermost first.
pub(crate) fn chain<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e: &&'a (dyn Error + 'static)| e.source())
}
