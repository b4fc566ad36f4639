//! Errors returned by [`Retry`](crate::Retry).
//!
//! The service's error type is [`BoxError`](crate::BoxError). When the layer
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

pub use tower_resilience_base::error::{
    AttemptsExhausted, BudgetExhausted, DeadlineTooClose, LocalRejection,
};

/// A replay body of an earlier attempt was polled after a newer attempt
/// started replaying the same request body; the earlier one can no longer
/// be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySuperseded {
    _p: (),
}

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
