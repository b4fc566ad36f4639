//! How one call counts for a layer that judges calls (the circuit
//! breaker's window, the fallback layer's causes): a success, a failure of
//! the dependency, or nothing at all, by a replaceable [`Classify`] policy
//! per response type.
//!
//! For HTTP and gRPC the defaults are the toolkit's one classification
//! ([`classify`](crate::classify), the retry layer's rules too), folded into
//! three [`Outcome`]s; one classifier value can therefore be handed to the
//! breaker and to the fallback layer, and judge the same way in both.
//!
//! ```
//! use tower_resilience_base::outcome::{Classify, DefaultClassifier, Outcome};
//!
//! let response = |status: u16| http::Response::builder().status(status).body(()).unwrap();
//! assert_eq!(DefaultClassifier.classify_response(&response(503)), Outcome::Failure);
//! assert_eq!(DefaultClassifier.classify_response(&response(404)), Outcome::Success);
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};

use crate::answer::is_local_answer;
use crate::classify::{self as shared, Class};

/// How one call (or attempt) counts.
///
/// For the circuit breaker, a [`Success`](Outcome::Success) that took at
/// least the slow-call threshold (when one is configured) counts as slow;
/// for the fallback layer, a [`Failure`](Outcome::Failure) is a cause to
/// answer with the fallback.
///
/// # Example
///
/// ```
/// use tower_resilience_base::classify::Class;
/// use tower_resilience_base::outcome::Outcome;
///
/// // A full bulkhead's refusal says nothing about the dependency.
/// assert_eq!(Outcome::from(Class::Local), Outcome::Ignored);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The dependency answered well.
    Success,
    /// The dependency failed: counts towards opening.
    Failure,
    /// Says nothing about the dependency (local overload, a rejection by
    /// another breaker, a caller that gave up): not counted at all.
    Ignored,
}

/// The replaceable rules of what counts as a failure, for responses of
/// type `Res`.
///
/// For HTTP and gRPC, the rules are the toolkit's one classification
/// ([`classify`](crate::classify), the retry layer's too): the
/// [`DefaultClassifier`] follows its defaults, and [`by_class`] turns any
/// [`Classify`](crate::classify::Classify) of it (a retry
/// policy, say) into a classifier of outcomes. Implement this trait directly
/// for responses that are not HTTP, or to judge by the body.
///
/// The error side has a default, [`classify_error`], so most
/// classifiers only decide about responses. Closures are classifiers
/// through [`classify_fn`].
///
/// The trait is object safe: `Arc<dyn Classify<Res>>` is a classifier too.
///
/// # Example
///
/// Count 429 as a failure too (the dependency is shedding load):
///
/// ```
/// use tower_resilience_base::outcome::{self as classify, Classify, Outcome};
///
/// #[derive(Debug, Clone)]
/// struct Also429;
///
/// impl<B> Classify<http::Response<B>> for Also429 {
///     fn classify_response(&self, response: &http::Response<B>) -> Outcome {
///         if response.status() == http::StatusCode::TOO_MANY_REQUESTS {
///             return Outcome::Failure;
///         }
///         classify::DefaultClassifier.classify_response(response)
///     }
/// }
///
/// let too_many = http::Response::builder().status(429).body(()).unwrap();
/// assert_eq!(Also429.classify_response(&too_many), Outcome::Failure);
/// ```
pub trait Classify<Res>: Send + Sync + 'static {
    /// How a response counts.
    fn classify_response(&self, response: &Res) -> Outcome;

    /// The outcome of a response seen only through its status and headers,
    /// when this classifier can tell from them alone (the default says it
    /// cannot).
    ///
    /// The attempt hook uses it: a retry layer below the breaker reports
    /// each attempt's response, whose type may differ from `Res` when a
    /// `map_response` sits between them. A classifier that answers here
    /// judges every attempt whatever the type; one that does not is asked
    /// [`classify_response`](Classify::classify_response) when the types
    /// match, and otherwise the [`DefaultClassifier`]'s rules apply (with a
    /// warning, once).
    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
        let _ = (status, headers);
        None
    }

    /// How an error of the inner service counts. Default:
    /// [`classify_error`].
    fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        classify_error(error)
    }

    /// The outcome of a response that the retry layer below already
    /// classified (the [`Class`] its policy gave, handed to the breaker
    /// with the attempt), when this classifier follows that shared
    /// classification. The default says it does not, and the breaker
    /// judges the response itself; the [`DefaultClassifier`] does, so in
    /// the recommended stack each response is judged once, by the retry
    /// policy's rules.
    fn classify_class(&self, class: Class) -> Option<Outcome> {
        let _ = class;
        None
    }
}

impl From<Class> for Outcome {
    /// A failure of the dependency ([`Class::is_failure`]: failed, or
    /// failed transiently) is a [`Outcome::Failure`]; a local rejection is
    /// [`Outcome::Ignored`]; an answer (a success, a rejected request, a
    /// throttled one) is a [`Outcome::Success`].
    ///
    /// # Example
    ///
    /// ```
    /// use tower_resilience_base::outcome::Outcome;
    /// use tower_resilience_base::classify::Class;
    ///
    /// assert_eq!(Outcome::from(Class::Transient { reason: "503", after: None }), Outcome::Failure);
    /// assert_eq!(Outcome::from(Class::Rejected), Outcome::Success);
    /// assert_eq!(Outcome::from(Class::Local), Outcome::Ignored);
    /// ```
    fn from(class: Class) -> Self {
        if class.is_failure() {
            Outcome::Failure
        } else if class == Class::Local {
            Outcome::Ignored
        } else {
            Outcome::Success
        }
    }
}

/// The default classifier of HTTP responses.
///
/// - An answer a layer of this process built when it refused the request
///   (it carries the [`LocalAnswer`](crate::answer::LocalAnswer)
///   extension: a full HTTP bulkhead's 503, a breaker's 503, a
///   deadline layer's 504) is [`Outcome::Ignored`]: the service behind was
///   not called.
/// - `5xx` responses are failures; every other status is a success (a 4xx
///   describes the caller, not the dependency).
/// - A trailers-only gRPC response (its status in the headers) with
///   `grpc-status` 2 UNKNOWN, 4 DEADLINE_EXCEEDED, 13 INTERNAL, 14
///   UNAVAILABLE or 15 DATA_LOSS is a failure; other gRPC statuses are
///   successes. (A status sent in the trailers after a body is not seen:
///   the breaker judges the response head.)
/// - Errors: see [`classify_error`].
///
/// # Example
///
/// ```
/// use tower_resilience_base::outcome::{Classify, DefaultClassifier, Outcome};
///
/// let response = |status: u16| http::Response::builder().status(status).body(()).unwrap();
/// assert_eq!(DefaultClassifier.classify_response(&response(200)), Outcome::Success);
/// assert_eq!(DefaultClassifier.classify_response(&response(404)), Outcome::Success);
/// assert_eq!(DefaultClassifier.classify_response(&response(503)), Outcome::Failure);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

/// A classifier for any response type: every response is a success, errors
/// follow [`classify_error`]. The default of the breaker's and the fallback
/// layer's plain flavours, for services whose responses are not HTTP.
///
/// # Example
///
/// ```
/// use tower_resilience_base::outcome::{Classify, ErrorsOnly, Outcome};
///
/// assert_eq!(ErrorsOnly.classify_response(&"anything"), Outcome::Success);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorsOnly;

/// A classifier of HTTP responses from a classifier of the
/// toolkit's shared classification; see [`by_class`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ByClass<C> {
    inner: C,
}

/// A classifier of `http::Response`s that judges by `classifier`,
/// a [`Classify`](crate::classify::Classify) of the
/// toolkit's shared classification (a retry policy is one): a response or
/// an error counts as the [`Outcome`] of its [`Class`]. As with the
/// [`DefaultClassifier`], an answer a layer of this process built when it
/// refused the request is [`Outcome::Ignored`].
///
/// Give the same classifier to the retry layer and the breaker, and the
/// two judge every response by the same rules.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_resilience_base::outcome::{self as classify, Classify as _, Outcome};
/// use tower_resilience_base::classify::{self as shared, Class, Classify};
///
/// // 500 is transient for this dependency: retried, and a failure.
/// #[derive(Debug, Clone)]
/// struct Flaky;
///
/// impl Classify for Flaky {
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Class {
///         match status.as_u16() {
///             500 => Class::Transient { reason: "500", after: None },
///             // 404 means the dependency lost its data: a failure.
///             404 => Class::Failed,
///             _ => shared::classify_response(status, headers),
///         }
///     }
/// }
///
/// let classifier = classify::by_class(Flaky);
/// let response = |status: u16| http::Response::builder().status(status).body(()).unwrap();
/// assert_eq!(classifier.classify_response(&response(404)), Outcome::Failure);
/// assert_eq!(classifier.classify_response(&response(429)), Outcome::Success);
/// ```
pub fn by_class<C>(classifier: C) -> ByClass<C> {
    ByClass { inner: classifier }
}

/// A classifier from a closure over the call's result; see [`classify_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F> {
    f: F,
}

/// A classifier from a closure that sees the call's result: `Ok(&response)`
/// or `Err(&error)`.
///
/// # Example
///
/// ```
/// use tower_resilience_base::outcome::{self as classify, classify_fn, Classify, Outcome};
///
/// let classifier = classify_fn(|result: Result<&u16, &(dyn std::error::Error + 'static)>| {
///     match result {
///         Ok(&code) if code >= 500 => Outcome::Failure,
///         Ok(_) => Outcome::Success,
///         Err(e) => classify::classify_error(e),
///     }
/// });
/// assert_eq!(classifier.classify_response(&502), Outcome::Failure);
/// ```
pub fn classify_fn<F>(f: F) -> ClassifyFn<F> {
    ClassifyFn { f }
}

/// The default classification of errors.
///
/// The [`Outcome`] of the error's [`Class`] by the toolkit's shared rules
/// ([`classify::classify_error`](crate::classify::classify_error)), which walk the
/// error and its `source()` chain:
///
/// - a local rejection
///   ([`is_local_rejection`](crate::error::is_local_rejection): a
///   breaker's `CircuitOpen`, a full bulkhead,
///   a deadline budget spent before the call, a `LocalRejection` of your
///   own) is [`Outcome::Ignored`]: the dependency was not called;
/// - everything else is a [`Outcome::Failure`]: transport errors, timeouts
///   (including `tower_deadline::error::DeadlineExceeded`: the dependency
///   did not answer in time) and any unknown error.
///
/// A caller that drops the response future (cancellation) produces no
/// error at all and is not counted.
///
/// # Example
///
/// ```
/// use std::io;
/// use tower_resilience_base::outcome::{classify_error, Outcome};
///
/// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
/// assert_eq!(classify_error(&refused), Outcome::Failure);
/// ```
#[must_use]
pub fn classify_error(error: &(dyn Error + 'static)) -> Outcome {
    Outcome::from(shared::classify_error(error))
}

/// The [`DefaultClassifier`]'s rule for a response: the [`Outcome`] of its
/// [`Class`] by the toolkit's shared rules
/// ([`classify::classify_response`](crate::classify::classify_response)). A 5xx status,
/// or a gRPC status that says the dependency failed (UNKNOWN,
/// DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE, DATA_LOSS), is a failure;
/// anything else (a 4xx describes the caller, a 429 a dependency that is
/// alive and shedding load) is a success.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_resilience_base::outcome::{default_outcome, Outcome};
///
/// assert_eq!(default_outcome(StatusCode::BAD_GATEWAY, &HeaderMap::new()), Outcome::Failure);
/// assert_eq!(default_outcome(StatusCode::NOT_FOUND, &HeaderMap::new()), Outcome::Success);
/// ```
#[must_use]
pub fn default_outcome(status: StatusCode, headers: &HeaderMap) -> Outcome {
    Outcome::from(shared::classify_response(status, headers))
}

// === impl DefaultClassifier ===

impl<B> Classify<Response<B>> for DefaultClassifier {
    #[inline]
    fn classify_response(&self, response: &Response<B>) -> Outcome {
        if is_local_answer(response) {
            return Outcome::Ignored;
        }
        default_outcome(response.status(), response.headers())
    }

    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
        Some(default_outcome(status, headers))
    }

    fn classify_class(&self, class: Class) -> Option<Outcome> {
        Some(Outcome::from(class))
    }
}

// === impl ByClass ===

impl<B, C: shared::Classify> Classify<Response<B>> for ByClass<C> {
    fn classify_response(&self, response: &Response<B>) -> Outcome {
        if is_local_answer(response) {
            return Outcome::Ignored;
        }
        Outcome::from(
            self.inner
                .classify_response(response.status(), response.headers()),
        )
    }

    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
        Some(Outcome::from(self.inner.classify_response(status, headers)))
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        Outcome::from(self.inner.classify_error(error))
    }
}

// === impl ErrorsOnly ===

impl<Res> Classify<Res> for ErrorsOnly {
    fn classify_response(&self, _response: &Res) -> Outcome {
        Outcome::Success
    }

    fn classify_head(&self, _status: StatusCode, _headers: &HeaderMap) -> Option<Outcome> {
        Some(Outcome::Success)
    }
}

// === impl ClassifyFn ===

impl<Res, F> Classify<Res> for ClassifyFn<F>
where
    F: Fn(Result<&Res, &(dyn Error + 'static)>) -> Outcome + Send + Sync + 'static,
{
    fn classify_response(&self, response: &Res) -> Outcome {
        (self.f)(Ok(response))
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        (self.f)(Err(error))
    }
}

impl<F> fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifyFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

impl<Res, C: Classify<Res> + ?Sized> Classify<Res> for Arc<C> {
    fn classify_response(&self, response: &Res) -> Outcome {
        (**self).classify_response(response)
    }

    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
        (**self).classify_head(status, headers)
    }

    fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        (**self).classify_error(error)
    }

    fn classify_class(&self, class: Class) -> Option<Outcome> {
        (**self).classify_class(class)
    }
}
