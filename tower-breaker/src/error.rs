//! The error of a breaker that rejects a call.
//!
//! In client mode ([`CircuitBreaker`](crate::CircuitBreaker) with the
//! default [`Client`](crate::mode::Client) or [`Plain`](crate::mode::Plain)
//! mode) the error type is [`BoxError`](crate::BoxError): either the inner
//! service's error, unchanged, or a [`CircuitOpen`]. Tell them apart with
//! `is` or `downcast_ref`, which keeps working when other layers above box
//! the error again:
//!
//! ```
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::{Breaker, BreakerLayer, Mode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let breaker = Breaker::new("payments");
//! breaker.set_mode(Mode::ForcedOpen);
//!
//! let client = ServiceBuilder::new()
//!     .map_err(|e: BoxError| e) // a second layer that passes the box on
//!     .layer(BreakerLayer::new(breaker))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, BoxError>(http::Response::new(()))
//!     }));
//!
//! let err = client.oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is::<CircuitOpen>());
//! let open = err.downcast_ref::<CircuitOpen>().unwrap();
//! assert_eq!(open.breaker(), "payments");
//! assert!(open.is_forced());
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The circuit is open (or half-open with every probe slot taken, or
/// ramping up): the call was rejected without calling the inner service.
///
/// It names the breaker and says how long until the breaker will let a
/// probe through ([`retry_after`](Self::retry_after)), which HTTP mode
/// turns into `Retry-After`. Creating one does not allocate (the name is
/// shared); boxing it into a [`BoxError`](crate::BoxError) is the only
/// allocation of a rejection.
///
/// It is also what the attempt hook returns to a retry layer below the
/// breaker to stop its retries, so the caller sees the same error whether
/// the circuit was open before the call or opened during its retries.
#[derive(Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    breaker: Arc<Name>,
    retry_after: Duration,
    forced: bool,
}

// === impl CircuitOpen ===

impl CircuitOpen {
    pub(crate) fn new(breaker: Arc<Name>, retry_after: Duration, forced: bool) -> Self {
        Self {
            breaker,
            retry_after,
            forced,
        }
    }

    /// The name of the breaker that rejected the call.
    #[must_use]
    pub fn breaker(&self) -> &str {
        &self.breaker.0
    }

    /// How long until the breaker lets a probe through: the rest of the
    /// open period; while half-open, the rest of the half-open wait; during
    /// a ramp-up, zero; when forced open, the configured open period (a
    /// hint only: a forced circuit opens when someone says so).
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// Whether the circuit was forced open by hand
    /// ([`Mode::ForcedOpen`](crate::Mode::ForcedOpen)).
    #[must_use]
    pub fn is_forced(&self) -> bool {
        self.forced
    }
}

impl fmt::Debug for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitOpen")
            .field("breaker", &&*self.breaker.0)
            .field("retry_after", &self.retry_after)
            .field("forced", &self.forced)
            .finish()
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.forced {
            write!(f, "circuit `{}` is forced open", self.breaker.0)
        } else {
            write!(
                f,
                "circuit `{}` is open, next probe in {} ms",
                self.breaker.0,
                self.retry_after.as_millis()
            )
        }
    }
}

/// What `CircuitOpen::source` points to: the retry crate's marker that a
/// rejection must not be retried.
#[cfg(feature = "retry")]
static LOCAL_REJECTION: tower_retry_budget::error::LocalRejection =
    tower_retry_budget::error::LocalRejection::new();

impl Error for CircuitOpen {
    /// With the `retry` feature, `tower_retry_budget`'s
    /// [`LocalRejection`](tower_retry_budget::error::LocalRejection) marker,
    /// so that no retry layer of this toolkit retries an open circuit, even
    /// one stacked above the breaker; without it, none.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        #[cfg(feature = "retry")]
        {
            Some(&LOCAL_REJECTION)
        }
        #[cfg(not(feature = "retry"))]
        {
            None
        }
    }
}

/// A breaker's name, alone on its cache lines: each thread stripe of a
/// breaker has its own, so creating errors on several threads does not
/// contend on one reference count.
#[derive(Debug, PartialEq, Eq)]
#[repr(align(128))]
pub(crate) struct Name(pub(crate) Arc<str>);
