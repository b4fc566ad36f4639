//! The error of a breaker that rejects a call.
//!
//! [`TypedCircuitBreaker`](crate::TypedCircuitBreaker) returns a
//! [`BreakerError`] instead, which needs no allocation to refuse a call.
//!
//! The error type of [`CircuitBreaker`](crate::CircuitBreaker) and
//! [`PlainCircuitBreaker`](crate::PlainCircuitBreaker) is
//! [`BoxError`](crate::BoxError): either the inner
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

pub use tower_resilience_base::error::CircuitOpen;

/// The error of a [`TypedCircuitBreaker`](crate::TypedCircuitBreaker): the
/// circuit refused the call, or the inner service failed. Not boxed, so a
/// refusal allocates nothing.
///
/// Both variants keep their cause as [`source`](Error::source), so
/// [`find`](tower_resilience_base::error::find), the HTTP and gRPC answers
/// and the retry layers' classification find a [`CircuitOpen`] (or the
/// inner error) in it after any number of layers that box it.
///
/// # Example
///
/// ```
/// use std::error::Error;
/// use std::time::Duration;
/// use tower_breaker::error::{BreakerError, CircuitOpen};
///
/// let open = CircuitOpen::new("users-db", Duration::from_secs(2), false);
/// let err: BreakerError<std::io::Error> = BreakerError::Open(open);
/// assert!(err.is_open());
/// assert_eq!(err.open().unwrap().breaker(), "users-db");
/// assert!(err.source().unwrap().is::<CircuitOpen>());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakerError<E> {
    /// The circuit was open (or half-open with every probe slot taken):
    /// the inner service was not called.
    Open(CircuitOpen),
    /// The inner service's error, unchanged.
    Inner(E),
}

impl<E> BreakerError<E> {
    /// Whether the circuit refused the call.
    #[must_use]
    pub const fn is_open(&self) -> bool {
        matches!(self, Self::Open(_))
    }

    /// The refusal, if the circuit refused the call.
    #[must_use]
    pub const fn open(&self) -> Option<&CircuitOpen> {
        match self {
            Self::Open(open) => Some(open),
            Self::Inner(_) => None,
        }
    }

    /// The inner service's error, if it failed.
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self {
            Self::Open(_) => None,
            Self::Inner(e) => Some(e),
        }
    }
}

impl<E> fmt::Display for BreakerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cause is the source: reporters that print the chain print
        // it once.
        match self {
            Self::Open(_) => f.write_str("the circuit breaker refused the call"),
            Self::Inner(_) => f.write_str("the service behind the circuit breaker failed"),
        }
    }
}

impl<E: Error + 'static> Error for BreakerError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Open(open) => Some(open),
            Self::Inner(e) => Some(e),
        }
    }
}
