//! Errors returned by [`Retry`](crate::Retry).
//!
//! The service's error type is [`BoxError`]. When the layer
//! gives up on a retryable *error* because a limit was reached, it wraps the
//! last attempt's error in the struct that names the limit:
//! [`AttemptsExhausted`], [`BudgetExhausted`] or [`DeadlineTooClose`]; the
//! original error is their [`source`](std::error::Error::source) and comes
//! back with `into_source`. An error that was not retryable in the first
//! place (a local rejection, a `tower-deadline` error, a non-idempotent
//! request, ...) is returned unchanged, and so is an error from the
//! [`AttemptHook`](crate::AttemptHook) (such as the breaker's "circuit
//! open"). A response is never turned into an error: see
//! [`GaveUp`](crate::GaveUp) for how a response says why retries ended.
//!
//! These errors are never retried by another [`Retry`](crate::Retry) layer
//! above, so retries happen in one tier only.
//!
//! ```
//! use std::io;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::error::AttemptsExhausted;
//! use tower_retry_budget::body::ReplayBody;
//! use tower_retry_budget::RetryLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let broken = service_fn(|_req: http::Request<ReplayBody<String>>| async {
//!     Err::<http::Response<()>, BoxError>(io::Error::from(io::ErrorKind::ConnectionReset).into())
//! });
//! let client = ServiceBuilder::new().layer(RetryLayer::new()).service(broken);
//!
//! let err = client.oneshot(http::Request::new(String::new())).await.unwrap_err();
//! let exhausted = err.downcast_ref::<AttemptsExhausted>().unwrap();
//! assert_eq!(exhausted.attempts(), 3);
//! assert!(std::error::Error::source(exhausted).unwrap().is::<io::Error>());
//! # }
//! ```

use std::error::Error;
use std::fmt;

use crate::BoxError;

/// Every allowed attempt failed with a retryable error; the last one is
/// the [`source`](Error::source).
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
#[derive(Debug)]
pub struct BudgetExhausted {
    attempts: u32,
    source: BoxError,
}

/// Not enough of the caller's deadline was left to back off and make
/// another attempt of at least the minimum slice; the last attempt's error
/// is the [`source`](Error::source).
#[derive(Debug)]
pub struct DeadlineTooClose {
    attempts: u32,
    source: BoxError,
}

/// A marker that says "this failure is a local rejection: do not retry it".
///
/// Layers that reject calls on purpose (a circuit breaker that is open, a
/// load shedder) and that want this crate's retry layer to leave their
/// errors alone put a `LocalRejection` in their error's
/// [`source`](Error::source) chain: [`is_local_rejection`] finds it there,
/// and [`Retry`](crate::Retry) never retries such an error, whatever its
/// policy says. `tower-breaker`'s `CircuitOpen` does this, so even a retry
/// layer stacked (wrongly) *above* a breaker does not retry against an open
/// circuit.
///
/// [`is_local_rejection`]: crate::policy::is_local_rejection
///
/// # Example
///
/// ```
/// use std::error::Error;
/// use std::fmt;
/// use tower_retry_budget::error::LocalRejection;
/// use tower_retry_budget::policy::is_local_rejection;
///
/// #[derive(Debug)]
/// struct Shed;
///
/// static REJECTED: LocalRejection = LocalRejection::new();
///
/// impl fmt::Display for Shed {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         f.write_str("load shed")
///     }
/// }
///
/// impl Error for Shed {
///     fn source(&self) -> Option<&(dyn Error + 'static)> {
///         Some(&REJECTED)
///     }
/// }
///
/// assert!(is_local_rejection(&Shed));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalRejection {
    _p: (),
}

/// A replay body of an earlier attempt was polled after a newer attempt
/// started replaying the same request body; the earlier one can no longer
/// be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySuperseded {
    _p: (),
}

macro_rules! exhausted {
    ($name:ident, $what:literal) => {
        // === impl $name ===

        impl $name {
            pub(crate) fn new(attempts: u32, source: BoxError) -> Self {
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

exhausted!(AttemptsExhausted, "retries exhausted");
exhausted!(BudgetExhausted, "retry refused by the retry budget");
exhausted!(
    DeadlineTooClose,
    "no time left to retry before the deadline"
);

// === impl LocalRejection ===

impl LocalRejection {
    /// The marker; `const`, so it can live in a `static` that an error's
    /// `source()` returns a reference to.
    #[must_use]
    pub const fn new() -> Self {
        Self { _p: () }
    }
}

impl fmt::Display for LocalRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rejected locally; retrying would only add load")
    }
}

impl Error for LocalRejection {}

// === impl ReplaySuperseded ===

impl ReplaySuperseded {
    pub(crate) const fn new() -> Self {
        Self { _p: () }
    }
}

impl fmt::Display for ReplaySuperseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request body superseded by a newer attempt")
    }
}

impl Error for ReplaySuperseded {}
