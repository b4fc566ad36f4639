use std::fmt;
use std::marker::PhantomData;

use tower_layer::Layer;

use crate::breaker::Breaker;
use crate::classify::{DefaultClassifier, ErrorsOnly};
use crate::mode::{Client, Plain, Server};
use crate::service::CircuitBreaker;

/// Wraps services in a [`CircuitBreaker`] that shares one [`Breaker`]; a
/// [`Layer`].
///
/// The state lives in the [`Breaker`], not in the layer's `layer` call:
/// every service built by [`Layer::layer`] (axum and hyper call it once per
/// connection), and every clone of those, shares the same circuit.
///
/// The type parameters are the classifier (default [`DefaultClassifier`])
/// and the mode (default [`Client`]; see [`crate::mode`]).
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
#[must_use]
pub struct BreakerLayer<C = DefaultClassifier, M = Client> {
    breaker: Breaker,
    classifier: C,
    count_attempts: bool,
    _mode: PhantomData<fn() -> M>,
}

// === impl BreakerLayer ===

impl BreakerLayer {
    /// A client-mode layer with the default classifier, counting every
    /// attempt of a retry layer below it.
    pub const fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            classifier: DefaultClassifier,
            count_attempts: true,
            _mode: PhantomData,
        }
    }
}

impl<C, M> BreakerLayer<C, M> {
    /// Replaces the classifier.
    pub fn classifier<D>(self, classifier: D) -> BreakerLayer<D, M> {
        BreakerLayer {
            breaker: self.breaker,
            classifier,
            count_attempts: self.count_attempts,
            _mode: PhantomData,
        }
    }

    /// Server mode, for `axum::Router::layer` and other HTTP servers:
    /// rejections become `503` with `Retry-After` and `x-tower-no-retry: 1`
    /// (gRPC: trailers-only, `grpc-status: 14`), and the inner error type
    /// passes through. See [`mode::Server`](crate::mode::Server).
    pub fn http_answers(self) -> BreakerLayer<C, Server> {
        BreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
            count_attempts: false,
            _mode: PhantomData,
        }
    }

    /// Plain mode, for requests of any type: no attempt hook, typed errors,
    /// and the [`ErrorsOnly`] classifier (responses succeed, errors fail);
    /// call [`classifier`](Self::classifier) afterwards to change it. See
    /// [`mode::Plain`](crate::mode::Plain).
    pub fn plain(self) -> BreakerLayer<ErrorsOnly, Plain> {
        BreakerLayer {
            breaker: self.breaker,
            classifier: ErrorsOnly,
            count_attempts: false,
            _mode: PhantomData,
        }
    }

    /// Whether client mode offers its attempt hook to a retry layer below
    /// (default true). The hook is shared by every call (no allocation);
    /// offering it costs a few nanoseconds per call, which a stack with no
    /// retry layer below can save.
    pub const fn count_attempts(mut self, on: bool) -> Self {
        self.count_attempts = on;
        self
    }

    /// The breaker.
    #[must_use]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<C: Clone, M> Clone for BreakerLayer<C, M> {
    fn clone(&self) -> Self {
        Self {
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            _mode: PhantomData,
        }
    }
}

impl<C: fmt::Debug, M> fmt::Debug for BreakerLayer<C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerLayer")
            .field("breaker", &self.breaker)
            .field("classifier", &self.classifier)
            .field("count_attempts", &self.count_attempts)
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl<S, C: Clone, M> Layer<S> for BreakerLayer<C, M> {
    type Service = CircuitBreaker<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::from_parts(
            inner,
            self.breaker.clone(),
            self.classifier.clone(),
            self.count_attempts,
        )
    }
}
