//! The error of [`Bulkhead`](crate::Bulkhead) when a compartment is full.
//!
//! [`Bulkhead`](crate::Bulkhead)'s error type is [`BoxError`](crate::BoxError):
//! either the inner service's error, unchanged, or a [`BulkheadFull`]. Tell
//! them apart with `is` or `downcast_ref`, which keeps working when other
//! layers above box the error again:
//!
//! ```
//! use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_bulkhead::error::BulkheadFull;
//! use tower_bulkhead::BulkheadLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (release, wait) = tokio::sync::oneshot::channel::<()>();
//! let wait = std::sync::Arc::new(tokio::sync::Mutex::new(Some(wait)));
//! let slow = service_fn(move |_req: &'static str| {
//!     let wait = wait.clone();
//!     async move {
//!         if let Some(wait) = wait.lock().await.take() {
//!             let _ = wait.await;
//!         }
//!         Ok::<_, BoxError>("done")
//!     }
//! });
//! let mut client = ServiceBuilder::new()
//!     .map_err(|e: BoxError| e) // a second layer that passes the box on
//!     .layer(BulkheadLayer::new("payments", 1))
//!     .service(slow);
//!
//! // The first call holds the only slot...
//! let first = client.ready().await.unwrap().call("a");
//! let first = tokio::spawn(first);
//! tokio::task::yield_now().await;
//!
//! // ...so the second is refused at once.
//! let err = client.ready().await.unwrap().call("b").await.unwrap_err();
//! let full = err.downcast_ref::<BulkheadFull>().expect("a bulkhead rejection");
//! assert_eq!(full.compartment(), "payments");
//! assert_eq!(full.limit(), 1);
//! assert!(!full.waited_and_timed_out());
//!
//! release.send(()).unwrap();
//! assert_eq!(first.await.unwrap().unwrap(), "done");
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A call was refused because its compartment was full: **local overload,
/// not a dependency failure**.
///
/// The dependency behind the compartment was not called and may be
/// perfectly healthy; this process simply has as many calls to it in flight
/// as it allows. So:
///
/// - a circuit breaker must not count it as a failure of the dependency
///   (`tower-breaker` downcasts to this type and ignores it);
/// - a retry layer must not retry it, which would only add load where there
///   is too much already (`tower-retry-budget` does not);
/// - over HTTP it becomes `503 Service Unavailable` with `Retry-After` and
///   [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER), or gRPC
///   `RESOURCE_EXHAUSTED`.
///
/// The rejection happened either at once ([`waited`](Self::waited) is zero)
/// or after the configured `max_wait` passed without a slot freeing up
/// ([`waited_and_timed_out`](Self::waited_and_timed_out)).
///
/// Creating one does not allocate: the compartment name is shared. Boxing it
/// into a [`BoxError`](crate::BoxError) is the only allocation of a
/// rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkheadFull {
    compartment: Arc<str>,
    limit: usize,
    waited: Option<Duration>,
}

// === impl BulkheadFull ===

impl BulkheadFull {
    pub(crate) const fn new(compartment: Arc<str>, limit: usize, waited: Option<Duration>) -> Self {
        Self {
            compartment,
            limit,
            waited,
        }
    }

    /// The name of the full compartment: the bulkhead's name, and for
    /// keyed bulkheads the key (`name["key"]`) or `name/fallback`.
    #[must_use]
    pub fn compartment(&self) -> &str {
        &self.compartment
    }

    /// The compartment's limit: how many calls were in flight when this one
    /// was refused.
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

impl std::error::Error for BulkheadFull {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lowercase_and_names_the_compartment() {
        let e = BulkheadFull::new("payments".into(), 8, None);
        assert_eq!(
            e.to_string(),
            "bulkhead compartment `payments` is full (8 in flight)"
        );
        let e = BulkheadFull::new("payments".into(), 8, Some(Duration::from_millis(50)));
        assert_eq!(
            e.to_string(),
            "bulkhead compartment `payments` is full (8 in flight) after waiting 50ms"
        );
        assert_eq!(e.waited(), Duration::from_millis(50));
        assert!(e.waited_and_timed_out());
    }
}
