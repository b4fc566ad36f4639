//! The attempt hook: how an outer layer (the circuit breaker) sees and gates
//! every attempt that a retry or hedging layer below it makes.
//!
//! The breaker sits *outside* the retry layer (so it fails fast before any
//! attempt is made) yet must count *every attempt* (so it sees three
//! failures where the dependency saw three calls). The two meet through the
//! [`CallContext`](crate::CallContext): the breaker admits the first
//! attempt, and puts its shared hook with that admission into the context
//! while it calls the layers below; a retry layer takes it out (it is then
//! the retry layer's job to report that attempt and admit every further
//! one), and the breaker, seeing it taken, counts nothing itself. Without a
//! retry layer below, nobody takes it, and the breaker counts the call.
//!
//! The protocol, for the layer that takes the hook ([`Attempts`] does the
//! bookkeeping):
//!
//! - every admitted attempt ([`AttemptHook::admit`], or the first one,
//!   admitted by the breaker) is either reported once with
//!   [`AttemptHook::record`] or given back with [`AttemptHook::cancel`]
//!   (it was never sent, or the caller gave up on it); dropping
//!   [`Attempts`] cancels what is in flight, so nothing leaks, not even a
//!   half-open probe slot;
//! - before each further attempt, [`AttemptHook::admit`]; an `Err` (for the
//!   breaker, `CircuitOpen`) ends the call with that very error;
//! - before sleeping a backoff, [`AttemptHook::check`], so a call whose
//!   failure just opened the circuit returns at once instead of sleeping
//!   first.
//!
//! Outcomes are handed over as an [`AttemptOutcome`]: the status and headers
//! of a response (enough for every HTTP and gRPC classification) plus the
//! response itself as `&dyn Any`. A hook therefore does not depend on the
//! exact response type of the layer that reports to it, so a
//! `map_response` between the breaker and the retry layer changes nothing.

use std::any::Any;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};

use crate::classify::Class;
use crate::BoxError;

/// Sees and gates every attempt of a retry or hedging layer below the layer
/// that owns it; see the [module docs](self) for the protocol.
///
/// One hook is shared by every call through a breaker (there is no
/// per-call allocation); per-call state travels in the [`AttemptToken`]s.
///
/// The trait is object safe and is used as `Arc<dyn AttemptHook>`.
///
/// # Example
///
/// A hook that lets three failures through, then stops the retries:
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken};
/// use tower_resilience_base::BoxError;
///
/// #[derive(Debug, Default)]
/// struct Tripwire {
///     failures: AtomicU32,
/// }
///
/// impl AttemptHook for Tripwire {
///     fn admit(&self) -> Result<AttemptToken, BoxError> {
///         if self.failures.load(Ordering::Relaxed) >= 3 {
///             return Err("circuit open".into());
///         }
///         Ok(AttemptToken::new(0, 0))
///     }
///
///     fn record(&self, _token: AttemptToken, outcome: AttemptOutcome<'_>) {
///         let failed = match outcome {
///             AttemptOutcome::Response(response) => response.status().is_server_error(),
///             AttemptOutcome::Error(_) => true,
///         };
///         if failed {
///             self.failures.fetch_add(1, Ordering::Relaxed);
///         }
///     }
///
///     fn cancel(&self, _token: AttemptToken) {}
/// }
/// ```
pub trait AttemptHook: Send + Sync + 'static {
    /// Admits one more attempt (a retry or a hedge).
    ///
    /// # Errors
    ///
    /// The error the caller should see instead of the attempt, such as a
    /// breaker's `CircuitOpen`; the layer returns it unchanged.
    fn admit(&self) -> Result<AttemptToken, BoxError>;

    /// Whether another attempt would be admitted now, without admitting
    /// one: asked before sleeping a backoff. The default says yes.
    ///
    /// # Errors
    ///
    /// As for [`admit`](AttemptHook::admit).
    fn check(&self) -> Result<(), BoxError> {
        Ok(())
    }

    /// The outcome of the attempt admitted with `token`; called once per
    /// token at most.
    fn record(&self, token: AttemptToken, outcome: AttemptOutcome<'_>);

    /// The attempt admitted with `token` will not be reported: it was never
    /// sent, or it was cancelled.
    fn cancel(&self, token: AttemptToken);
}

/// An admitted attempt, as the hook that admitted it encodes it: two words
/// that mean something only to that hook.
///
/// # Example
///
/// ```
/// use tower_resilience_base::hook::AttemptToken;
///
/// let token = AttemptToken::new(7, 42);
/// assert_eq!(token.parts(), (7, 42));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttemptToken {
    a: u64,
    b: u64,
}

/// The outcome of one attempt, as a hook sees it.
#[derive(Clone, Copy)]
pub enum AttemptOutcome<'a> {
    /// The attempt got a response (of any status).
    Response(ResponseView<'a>),
    /// The attempt failed with an error.
    Error(&'a (dyn Error + 'static)),
}

/// A response, seen through its status and headers (all an HTTP or gRPC
/// classification needs) and, for hooks that know its type, as `&dyn Any`.
///
/// # Example
///
/// ```
/// use tower_resilience_base::hook::ResponseView;
///
/// let response = http::Response::new("body");
/// let view = ResponseView::of(&response);
/// assert_eq!(view.status(), 200);
/// assert_eq!(view.downcast_ref::<http::Response<&str>>().map(|r| *r.body()), Some("body"));
/// assert!(view.downcast_ref::<http::Response<String>>().is_none());
/// ```
#[derive(Clone, Copy)]
pub struct ResponseView<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    response: &'a dyn Any,
    class: Option<Class>,
}

/// The attempts of one call, seen from the layer that took the hook: the
/// hook and the admission of the attempt in flight.
///
/// Dropping it cancels the attempt in flight, if any, so an abandoned call
/// never leaks an admission (a breaker's half-open probe slot, say).
///
/// # Example
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken, Attempts};
/// use tower_resilience_base::BoxError;
///
/// #[derive(Debug, Default)]
/// struct Counts {
///     recorded: AtomicUsize,
///     cancelled: AtomicUsize,
/// }
///
/// impl AttemptHook for Counts {
///     fn admit(&self) -> Result<AttemptToken, BoxError> {
///         Ok(AttemptToken::new(0, 0))
///     }
///     fn record(&self, _: AttemptToken, _: AttemptOutcome<'_>) {
///         self.recorded.fetch_add(1, Ordering::Relaxed);
///     }
///     fn cancel(&self, _: AttemptToken) {
///         self.cancelled.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let counts = Arc::new(Counts::default());
/// let mut attempts = Attempts::new(counts.clone(), AttemptToken::new(0, 0));
/// attempts.record(AttemptOutcome::Error(&std::fmt::Error));
/// attempts.admit().unwrap();
/// drop(attempts); // the second attempt was never reported: cancelled
/// assert_eq!(counts.recorded.load(Ordering::Relaxed), 1);
/// assert_eq!(counts.cancelled.load(Ordering::Relaxed), 1);
/// ```
pub struct Attempts {
    hook: Arc<dyn AttemptHook>,
    in_flight: Option<AttemptToken>,
}

// === impl AttemptToken ===

impl AttemptToken {
    /// A token made of two words of the hook's choosing.
    #[must_use]
    pub const fn new(a: u64, b: u64) -> Self {
        Self { a, b }
    }

    /// The two words given to [`new`](AttemptToken::new).
    #[must_use]
    pub const fn parts(self) -> (u64, u64) {
        (self.a, self.b)
    }
}

// === impl AttemptOutcome ===

impl<'a> AttemptOutcome<'a> {
    /// The outcome of an attempt that produced `result`.
    pub fn of<B: 'static>(result: Result<&'a Response<B>, &'a (dyn Error + 'static)>) -> Self {
        match result {
            Ok(response) => Self::Response(ResponseView::of(response)),
            Err(e) => Self::Error(e),
        }
    }
}

impl fmt::Debug for AttemptOutcome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Response(view) => f.debug_tuple("Response").field(view).finish(),
            Self::Error(e) => f.debug_tuple("Error").field(&format_args!("{e}")).finish(),
        }
    }
}

// === impl ResponseView ===

impl<'a> ResponseView<'a> {
    /// A view of an `http::Response`.
    pub fn of<B: 'static>(response: &'a Response<B>) -> Self {
        Self {
            status: response.status(),
            headers: response.headers(),
            response,
            class: None,
        }
    }

    /// A view of any response, with the status and headers that describe it.
    pub fn new(status: StatusCode, headers: &'a HeaderMap, response: &'a dyn Any) -> Self {
        Self {
            status,
            headers,
            response,
            class: None,
        }
    }

    /// The same view, with the [`Class`] the reporting layer decided for
    /// the response (a retry layer reports the class its policy gave), so
    /// that the hook need not judge the response again.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::classify::Class;
    /// use tower_resilience_base::hook::ResponseView;
    ///
    /// let response = http::Response::builder().status(503).body(()).unwrap();
    /// let view = ResponseView::of(&response);
    /// assert_eq!(view.class(), None);
    /// let class = Class::Transient { reason: "503", after: None };
    /// assert_eq!(view.with_class(class).class(), Some(class));
    /// ```
    #[must_use]
    pub fn with_class(self, class: Class) -> Self {
        Self {
            class: Some(class),
            ..self
        }
    }

    /// The class the reporting layer decided for the response, if it gave
    /// one ([`with_class`](ResponseView::with_class)).
    #[must_use]
    pub fn class(&self) -> Option<Class> {
        self.class
    }

    /// The response's status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response's headers (where a trailers-only gRPC answer carries
    /// `grpc-status`).
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The response itself, if it is a `T`.
    #[must_use]
    pub fn downcast_ref<T: Any>(&self) -> Option<&'a T> {
        self.response.downcast_ref()
    }
}

impl fmt::Debug for ResponseView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseView")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

// === impl Attempts ===

impl Attempts {
    /// The attempts of a call whose first attempt `hook` admitted as
    /// `first`.
    pub fn new(hook: Arc<dyn AttemptHook>, first: AttemptToken) -> Self {
        Self {
            hook,
            in_flight: Some(first),
        }
    }

    /// The hook, for a layer that runs several attempts at once (hedging)
    /// and keeps their tokens itself.
    #[must_use]
    pub fn hook(&self) -> &Arc<dyn AttemptHook> {
        &self.hook
    }

    /// Reports the outcome of the attempt in flight (nothing when none is).
    pub fn record(&mut self, outcome: AttemptOutcome<'_>) {
        if let Some(token) = self.in_flight.take() {
            self.hook.record(token, outcome);
        }
    }

    /// Asks the hook whether another attempt would be admitted.
    ///
    /// # Errors
    ///
    /// The hook's error, unchanged.
    pub fn check(&self) -> Result<(), BoxError> {
        self.hook.check()
    }

    /// Admits the next attempt (cancelling one still in flight, which will
    /// then never be reported).
    ///
    /// # Errors
    ///
    /// The hook's error, unchanged: the attempt must not be sent.
    pub fn admit(&mut self) -> Result<(), BoxError> {
        if let Some(stale) = self.in_flight.take() {
            self.hook.cancel(stale);
        }
        self.in_flight = Some(self.hook.admit()?);
        Ok(())
    }

    /// Gives back the admission in flight without cancelling it, for the
    /// layer that put the hook in the context and finds it untaken.
    #[must_use]
    pub fn into_in_flight(mut self) -> Option<AttemptToken> {
        self.in_flight.take()
    }

    /// Takes the admission in flight without cancelling it, and keeps the
    /// hook: the layer that offered it and finds it untaken can keep this
    /// `Attempts` for its next call ([`restart`](Attempts::restart))
    /// instead of cloning the hook's `Arc` again (two atomic operations per
    /// call saved).
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken, Attempts};
    /// use tower_resilience_base::{BoxError, CallContext};
    ///
    /// #[derive(Debug)]
    /// struct Counts;
    ///
    /// impl AttemptHook for Counts {
    ///     fn admit(&self) -> Result<AttemptToken, BoxError> {
    ///         Ok(AttemptToken::new(0, 0))
    ///     }
    ///     fn record(&self, _: AttemptToken, _: AttemptOutcome<'_>) {}
    ///     fn cancel(&self, _: AttemptToken) {}
    /// }
    ///
    /// let mut kept: Option<Attempts> = None;
    /// for call in 1..=2 {
    ///     let first = AttemptToken::new(call, 0);
    ///     let attempts = match kept.take() {
    ///         Some(mut attempts) => {
    ///             attempts.restart(first);
    ///             attempts
    ///         }
    ///         None => Attempts::new(Arc::new(Counts), first),
    ///     };
    ///     let mut left = None;
    ///     CallContext::offer_attempts_into(attempts, &mut left, || ());
    ///     // Nobody took it: the admission is this layer's to count, the
    ///     // hook is kept for the next call.
    ///     let mut untaken = left.expect("no layer below takes the hook");
    ///     assert_eq!(untaken.take_in_flight(), Some(first));
    ///     kept = Some(untaken);
    /// }
    /// ```
    #[must_use]
    pub fn take_in_flight(&mut self) -> Option<AttemptToken> {
        self.in_flight.take()
    }

    /// Starts over with `first` as the attempt in flight (cancelling one
    /// still in flight, which will then never be reported): the reuse of an
    /// `Attempts` whose hook nobody took ([`take_in_flight`](Attempts::take_in_flight)).
    pub fn restart(&mut self, first: AttemptToken) {
        if let Some(stale) = self.in_flight.replace(first) {
            self.hook.cancel(stale);
        }
    }
}

impl Drop for Attempts {
    fn drop(&mut self) {
        if let Some(token) = self.in_flight.take() {
            self.hook.cancel(token);
        }
    }
}

impl fmt::Debug for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempts")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}
