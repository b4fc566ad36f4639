use tower_layer::Layer;

use crate::breaker::Breaker;
use crate::classify::{DefaultClassifier, ErrorsOnly};
use crate::service::{
    CircuitBreaker, HttpCircuitBreaker, PlainCircuitBreaker, TypedCircuitBreaker,
};

/// Wraps HTTP client services in a [`CircuitBreaker`] that shares one
/// [`Breaker`]; a [`Layer`].
///
/// The client flavour (see [Flavours](crate#flavours)): typed errors
/// ([`CircuitOpen`](crate::error::CircuitOpen) in a
/// [`BoxError`](crate::BoxError)) and the attempt hook for a retry layer
/// below. [`http_answers`](Self::http_answers) turns it into an
/// [`HttpBreakerLayer`], [`plain`](Self::plain) into a
/// [`PlainBreakerLayer`].
///
/// The state lives in the [`Breaker`], not in the layer's `layer` call:
/// every service built by [`Layer::layer`] (axum and hyper call it once per
/// connection), and every clone of those, shares the same circuit.
///
/// The type parameter is the [classifier](crate::Classify) (default
/// [`DefaultClassifier`]).
///
/// # Clone
///
/// Clones share the breaker and clone the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::{Breaker, BreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let breaker = Breaker::new("users");
/// let client = ServiceBuilder::new()
///     .layer(BreakerLayer::new(breaker.clone()))
///     .service(service_fn(|_req: http::Request<()>| async {
///         Ok::<_, BoxError>(http::Response::new(()))
///     }));
/// client.oneshot(http::Request::new(())).await?;
/// assert_eq!(breaker.snapshot().totals.successful, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct BreakerLayer<C = DefaultClassifier> {
    breaker: Breaker,
    classifier: C,
    count_attempts: bool,
}

/// Wraps HTTP server services in an [`HttpCircuitBreaker`] that shares one
/// [`Breaker`]; a [`Layer`] for `axum::Router::layer`,
/// `tonic::transport::Server::layer` or hyper.
///
/// The server flavour (see [Flavours](crate#flavours)): while the circuit
/// is open, requests are answered `503 Service Unavailable` with
/// `Retry-After` and `x-tower-no-retry: 1` (gRPC: a trailers-only
/// UNAVAILABLE), and the inner error type passes through unchanged.
///
/// Every service it builds, and every clone of those, shares the circuit
/// of the [`Breaker`]. The type parameter is the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]).
///
/// # Clone
///
/// Clones share the breaker and clone the classifier.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_breaker::{Breaker, HttpBreakerLayer, Mode};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("backend");
/// breaker.set_mode(Mode::ForcedOpen);
///
/// let server = ServiceBuilder::new()
///     .layer(HttpBreakerLayer::new(breaker))
///     .service(service_fn(|_req: http::Request<()>| async {
///         Ok::<_, Infallible>(http::Response::new(String::new()))
///     }));
/// let response = server.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["x-tower-no-retry"], "1");
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct HttpBreakerLayer<C = DefaultClassifier> {
    breaker: Breaker,
    classifier: C,
}

/// Wraps services of any request type in a [`PlainCircuitBreaker`] that
/// shares one [`Breaker`]; a [`Layer`].
///
/// The plain flavour (see [Flavours](crate#flavours)): typed errors, each
/// call counted once, no attempt hook. The type parameter is the
/// [classifier](crate::Classify), by default [`ErrorsOnly`] (every response
/// succeeds, errors fail), since the response need not be HTTP.
///
/// # Clone
///
/// Clones share the breaker and clone the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::{Breaker, PlainBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let breaker = Breaker::new("lookup");
/// let lookup = ServiceBuilder::new()
///     .layer(PlainBreakerLayer::new(breaker.clone()))
///     .service(service_fn(|id: u32| async move { Ok::<_, BoxError>(id * 2) }));
/// assert_eq!(lookup.oneshot(21).await?, 42);
/// assert_eq!(breaker.snapshot().totals.successful, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PlainBreakerLayer<C = ErrorsOnly> {
    breaker: Breaker,
    classifier: C,
}

/// Wraps services of any request type in a [`TypedCircuitBreaker`] that
/// shares one [`Breaker`]; a [`Layer`].
///
/// The plain flavour with an unboxed error, [`BreakerError`]: a refusal
/// allocates nothing. The type parameter is the
/// [classifier](crate::Classify), by default [`ErrorsOnly`].
///
/// # Clone
///
/// Clones share the breaker and clone the classifier.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_breaker::{Breaker, PlainBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let breaker = Breaker::new("users-db");
/// let lookup = ServiceBuilder::new()
///     .layer(PlainBreakerLayer::new(breaker.clone()).typed())
///     .service(service_fn(|id: u32| async move { Ok::<_, Infallible>(id * 2) }));
/// assert_eq!(lookup.oneshot(21).await.unwrap(), 42);
/// assert_eq!(breaker.snapshot().totals.successful, 1);
/// # }
/// ```
///
/// [`BreakerError`]: crate::error::BreakerError
#[derive(Debug, Clone)]
#[must_use]
pub struct TypedBreakerLayer<C = ErrorsOnly> {
    breaker: Breaker,
    classifier: C,
}

// === impl BreakerLayer ===

impl BreakerLayer {
    /// A client layer for `breaker` with the [`DefaultClassifier`],
    /// offering its attempt hook to a retry layer below, so that every
    /// attempt is counted.
    pub const fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: DefaultClassifier,
            count_attempts: true,
        }
    }
}

impl<C> BreakerLayer<C> {
    /// Replaces the classifier, which judges each outcome (see
    /// [`Classify`](crate::Classify)).
    pub fn classifier<D>(self, classifier: D) -> BreakerLayer<D> {
        BreakerLayer {
            breaker: self.breaker,
            classifier,
            count_attempts: self.count_attempts,
        }
    }

    /// Whether the layer offers its attempt hook to a retry layer below
    /// (default true). The hook is shared by every call (no allocation);
    /// offering it costs a few nanoseconds per call, which a stack with no
    /// retry layer below can save.
    pub const fn count_attempts(mut self, on: bool) -> Self {
        self.count_attempts = on;
        self
    }

    /// The server flavour with the same breaker and classifier: the same as
    /// [`HttpBreakerLayer::new`] followed by
    /// [`classifier`](HttpBreakerLayer::classifier). The
    /// [`count_attempts`](Self::count_attempts) setting is dropped (a server
    /// counts each request once).
    pub fn http_answers(self) -> HttpBreakerLayer<C> {
        HttpBreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
        }
    }

    /// The plain flavour with the same breaker and the [`ErrorsOnly`]
    /// classifier (a custom classifier set before is dropped, since it
    /// judges HTTP responses): the same as [`PlainBreakerLayer::new`]. Call
    /// [`classifier`](PlainBreakerLayer::classifier) afterwards to change
    /// it.
    pub fn plain(self) -> PlainBreakerLayer<ErrorsOnly> {
        PlainBreakerLayer::new(self.breaker)
    }

    /// The breaker.
    #[must_use]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C: Clone> Layer<S> for BreakerLayer<C> {
    type Service = CircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::from_parts(
            inner,
            self.breaker.clone(),
            self.classifier.clone(),
            self.count_attempts,
        )
    }
}

// === impl HttpBreakerLayer ===

impl HttpBreakerLayer {
    /// A server layer for `breaker` with the [`DefaultClassifier`] (`5xx`
    /// and the gRPC statuses of a failing server fail, `4xx` succeed); an
    /// error of the inner service always counts as a failure.
    pub const fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: DefaultClassifier,
        }
    }
}

impl<C> HttpBreakerLayer<C> {
    /// Replaces the classifier, which judges each response (see
    /// [`Classify`](crate::Classify)).
    pub fn classifier<D>(self, classifier: D) -> HttpBreakerLayer<D> {
        HttpBreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The breaker.
    #[must_use]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C: Clone> Layer<S> for HttpBreakerLayer<C> {
    type Service = HttpCircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpCircuitBreaker::from_parts(inner, self.breaker.clone(), self.classifier.clone())
    }
}

// === impl PlainBreakerLayer ===

impl PlainBreakerLayer {
    /// A plain layer for `breaker` with the [`ErrorsOnly`] classifier:
    /// every response succeeds, errors fail.
    pub const fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: ErrorsOnly,
        }
    }
}

impl<C> PlainBreakerLayer<C> {
    /// Replaces the classifier, which judges each outcome (see
    /// [`Classify`](crate::Classify); [`classify_fn`](crate::classify::classify_fn)
    /// builds one from a closure).
    pub fn classifier<D>(self, classifier: D) -> PlainBreakerLayer<D> {
        PlainBreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The same layer with an unboxed error: it builds
    /// [`TypedCircuitBreaker`]s, whose refusals allocate nothing.
    pub fn typed(self) -> TypedBreakerLayer<C> {
        TypedBreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
        }
    }

    /// The breaker.
    #[must_use]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C: Clone> Layer<S> for PlainBreakerLayer<C> {
    type Service = PlainCircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PlainCircuitBreaker::from_parts(inner, self.breaker.clone(), self.classifier.clone())
    }
}

// === impl TypedBreakerLayer ===

impl TypedBreakerLayer {
    /// A layer for `breaker` with the [`ErrorsOnly`] classifier: every
    /// response succeeds, errors fail.
    pub const fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: ErrorsOnly,
        }
    }
}

impl<C> TypedBreakerLayer<C> {
    /// Replaces the classifier, which judges each outcome (see
    /// [`Classify`](crate::Classify)).
    pub fn classifier<D>(self, classifier: D) -> TypedBreakerLayer<D> {
        TypedBreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The breaker.
    #[must_use]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C: Clone> Layer<S> for TypedBreakerLayer<C> {
    type Service = TypedCircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        TypedCircuitBreaker::from_parts(inner, self.breaker.clone(), self.classifier.clone())
    }
}
