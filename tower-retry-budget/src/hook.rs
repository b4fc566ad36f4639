//! The attempt hook: how an outer layer (the circuit breaker) sees every
//! attempt of the retry loop and stops it.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::BoxError;

/// Told about every attempt the retry layer makes, and asked before every
/// retry.
///
/// A layer *outside* [`Retry`](crate::Retry), typically a circuit breaker,
/// implements this trait and puts an [`AttemptHandle`] into the request's
/// extensions. When the retry layer finds `AttemptHandle<S::Response>`
/// there, it:
///
/// - calls [`record`](AttemptHook::record) once for every attempt it makes,
///   including the first and the last, with the attempt's outcome and
///   duration (an attempt cancelled because the caller dropped the response
///   future is not recorded);
/// - calls [`before_retry`](AttemptHook::before_retry) right before sending
///   each retry (never before the first attempt), after the backoff and
///   once the inner service is ready; an `Err` ends the retries at once and
///   the retry layer fails with that very error (for example the breaker's
///   "circuit open"), so it still downcasts to the hook's type.
///
/// The retry layer takes the handle out of the request's extensions: the
/// attempts it sends below do not carry it, so a second retry layer further
/// down cannot record the same attempts again.
///
/// That `record` was called at all tells the outer layer that the attempts
/// were counted below it, so it should not count the final outcome a second
/// time; without a retry layer below, nothing calls it and the outer layer
/// counts each call itself.
///
/// The trait is object safe and is used as `Arc<dyn AttemptHook<Res>>`.
///
/// # Example
///
/// A hook that allows three failures, then stops the retries:
///
/// ```
/// use std::error::Error;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use tower_retry_budget::{AttemptHook, BoxError};
///
/// #[derive(Debug, Default)]
/// struct Tripwire {
///     failures: AtomicU32,
/// }
///
/// impl AttemptHook<http::Response<()>> for Tripwire {
///     fn before_retry(&self) -> Result<(), BoxError> {
///         if self.failures.load(Ordering::Relaxed) >= 3 {
///             return Err("circuit open".into());
///         }
///         Ok(())
///     }
///
///     fn record(
///         &self,
///         outcome: Result<&http::Response<()>, &(dyn Error + 'static)>,
///         _elapsed: Duration,
///     ) {
///         let failed = match outcome {
///             Ok(response) => response.status().is_server_error(),
///             Err(_) => true,
///         };
///         if failed {
///             self.failures.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait AttemptHook<Res>: Send + Sync + 'static {
    /// Asked right before every retry (not before the first attempt). `Err`
    /// stops retrying at once, and the retry layer fails with that error.
    ///
    /// # Errors
    ///
    /// Whatever error the implementation wants the caller to see instead of
    /// a retry, such as a breaker's "circuit open".
    fn before_retry(&self) -> Result<(), BoxError>;

    /// Told the outcome of every attempt, including the first and the last,
    /// exactly once each, with the attempt's duration.
    fn record(&self, outcome: Result<&Res, &(dyn Error + 'static)>, elapsed: Duration);
}

/// A cheap, cloneable handle to an [`AttemptHook`], meant for
/// `http::Request::extensions()`.
///
/// The retry layer looks up `AttemptHandle<S::Response>`, where `S` is the
/// service it wraps, so the handle's response type must match exactly (for
/// example `AttemptHandle<http::Response<hyper::body::Incoming>>`).
///
/// # Clone
///
/// Clones share the hook (one `Arc`).
///
/// # Example
///
/// ```
/// use std::error::Error;
/// use std::time::Duration;
/// use tower_retry_budget::{AttemptHandle, AttemptHook, BoxError};
///
/// #[derive(Debug)]
/// struct Quiet;
///
/// impl AttemptHook<http::Response<String>> for Quiet {
///     fn before_retry(&self) -> Result<(), BoxError> {
///         Ok(())
///     }
///     fn record(&self, _: Result<&http::Response<String>, &(dyn Error + 'static)>, _: Duration) {}
/// }
///
/// let mut request = http::Request::new(String::new());
/// request.extensions_mut().insert(AttemptHandle::new(Quiet));
/// assert!(request
///     .extensions()
///     .get::<AttemptHandle<http::Response<String>>>()
///     .is_some());
/// ```
pub struct AttemptHandle<Res>(Arc<dyn AttemptHook<Res>>);

// === impl AttemptHandle ===

impl<Res: 'static> AttemptHandle<Res> {
    /// Wraps a hook in a new handle.
    pub fn new(hook: impl AttemptHook<Res>) -> Self {
        Self(Arc::new(hook))
    }

    /// A handle on a hook that is already shared.
    pub fn from_arc(hook: Arc<dyn AttemptHook<Res>>) -> Self {
        Self(hook)
    }

    /// The hook.
    #[must_use]
    pub fn hook(&self) -> &Arc<dyn AttemptHook<Res>> {
        &self.0
    }

    /// Forwards to [`AttemptHook::before_retry`].
    ///
    /// # Errors
    ///
    /// The hook's error, unchanged.
    pub fn before_retry(&self) -> Result<(), BoxError> {
        self.0.before_retry()
    }

    /// Forwards to [`AttemptHook::record`].
    pub fn record(&self, outcome: Result<&Res, &(dyn Error + 'static)>, elapsed: Duration) {
        self.0.record(outcome, elapsed);
    }
}

impl<Res> Clone for AttemptHandle<Res> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<Res> fmt::Debug for AttemptHandle<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptHandle").finish_non_exhaustive()
    }
}
