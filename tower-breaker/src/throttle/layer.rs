//! The layers: [`ThrottleLayer`] and [`PlainThrottleLayer`].

use std::time::Duration;

use tower_layer::Layer;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::outcome::ErrorsOnly;
use tower_resilience_base::random::RandomSource;

use super::classify::ThrottleClassifier;
use super::config::{ThrottleConfig, ThrottleConfigError};
use super::handle::ThrottleHandle;
use super::service::{PlainThrottle, Throttle};
use tower_resilience_base::Name;

/// Wraps HTTP client services in a [`Throttle`] that shares one
/// [`ThrottleHandle`]; a [`Layer`].
///
/// The state lives in the handle, not in the `layer` call: every service
/// built by [`Layer::layer`], and every clone of those, shares the same
/// window.
///
/// The setters ([`window`](Self::window), [`k`](Self::k), ...) build a new
/// handle with the changed settings, brought into range as each setter
/// says (they never fail); take the [`handle`](Self::handle) after the
/// last one. [`try_with_config`](Self::try_with_config) refuses invalid
/// settings with a [`ThrottleConfigError`] instead.
///
/// The type parameter is the [classifier](crate::Classify) of accepts
/// (default [`ThrottleClassifier`]).
///
/// # Clone
///
/// Clones share the handle and clone the classifier.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::throttle::ThrottleLayer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let layer = ThrottleLayer::new("users")
///     .window(Duration::from_secs(30))
///     .k(2.0)
///     .max_rejection(0.8);
/// let handle = layer.handle().clone();
/// let client = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|_req: http::Request<()>| async {
///         Ok::<_, BoxError>(http::Response::new(()))
///     }));
/// client.oneshot(http::Request::new(())).await?;
/// assert_eq!(handle.snapshot().requests, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ThrottleLayer<C = ThrottleClassifier> {
    handle: ThrottleHandle,
    classifier: C,
}

/// Wraps services of any request type in a [`PlainThrottle`] that shares
/// one [`ThrottleHandle`]; a [`Layer`]. The classifier defaults to
/// [`ErrorsOnly`].
///
/// # Clone
///
/// Clones share the handle and clone the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::throttle::ThrottleLayer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let layer = ThrottleLayer::new("lookup").plain();
/// let handle = layer.handle().clone();
/// let lookup = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|id: u32| async move { Ok::<_, BoxError>(id + 1) }));
/// assert_eq!(lookup.oneshot(1).await?, 2);
/// assert_eq!(handle.snapshot().accepts, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PlainThrottleLayer<C = ErrorsOnly> {
    handle: ThrottleHandle,
    classifier: C,
}

// === impl ThrottleLayer ===

impl ThrottleLayer {
    /// A layer with a new throttle named `name`, with the default settings
    /// ([`ThrottleConfig::new`]) and the [`ThrottleClassifier`].
    pub fn new(name: impl Into<Name>) -> Self {
        Self::with_handle(ThrottleHandle::new(name))
    }

    /// A layer with a new throttle named `name` with `config`.
    ///
    /// # Errors
    ///
    /// A [`ThrottleConfigError`] when a setting is out of range.
    pub fn try_with_config(
        name: impl Into<Name>,
        config: ThrottleConfig,
    ) -> Result<Self, ThrottleConfigError> {
        ThrottleHandle::try_with_config(name, config).map(Self::with_handle)
    }

    /// A layer for an existing throttle (shared with other layers or
    /// read by a dashboard).
    pub fn with_handle(handle: ThrottleHandle) -> Self {
        Self {
            handle,
            classifier: ThrottleClassifier,
        }
    }
}

impl<C> ThrottleLayer<C> {
    fn reconfigure(mut self, change: impl FnOnce(ThrottleConfig) -> ThrottleConfig) -> Self {
        let name = self.handle.name_handle().clone();
        let config = change(self.handle.config());
        self.handle = ThrottleHandle::clamped(name, config);
        self
    }

    /// The window (default 120 s); see [`ThrottleConfig::window`]. Clamped
    /// to 60 ms ..= 1 day.
    pub fn window(self, window: Duration) -> Self {
        self.reconfigure(|c| c.window(window))
    }

    /// `Critical` requests' K (default 2.0); see [`ThrottleConfig::k`]. A
    /// value below 1.0 is taken as 1.0, NaN as the default.
    pub fn k(self, k: f64) -> Self {
        self.reconfigure(|c| c.k(k))
    }

    /// The K of requests of `criticality`; see
    /// [`ThrottleConfig::criticality_k`]. Brought into range as
    /// [`k`](Self::k) is, then into order: `CriticalPlus`'s is raised to
    /// `Critical`'s, a sheddable one lowered to that of the next
    /// criticality up.
    pub fn criticality_k(self, criticality: Criticality, k: f64) -> Self {
        self.reconfigure(|c| c.criticality_k(criticality, k))
    }

    /// The cap on the rejection share (default 0.9); see
    /// [`ThrottleConfig::max_rejection`]. Clamped to `0.0..=1.0`, NaN taken
    /// as the default.
    pub fn max_rejection(self, max: f64) -> Self {
        self.reconfigure(|c| c.max_rejection(max))
    }

    /// The least number of requests in the window before any rejection
    /// (default 10); see [`ThrottleConfig::min_requests`].
    pub fn min_requests(self, min: u64) -> Self {
        self.reconfigure(|c| c.min_requests(min))
    }

    /// The random source of the draws; see [`ThrottleConfig::random`].
    pub fn random(self, random: impl RandomSource) -> Self {
        self.reconfigure(|c| c.random(random))
    }

    /// Tell time by the coarse clock (off by default); see
    /// [`ThrottleConfig::coarse_clock`].
    pub fn coarse_clock(self, on: bool) -> Self {
        self.reconfigure(|c| c.coarse_clock(on))
    }

    /// Replaces the classifier, which judges what the dependency accepted
    /// (see [`Classify`](crate::Classify)).
    pub fn classifier<D>(self, classifier: D) -> ThrottleLayer<D> {
        ThrottleLayer {
            handle: self.handle,
            classifier,
        }
    }

    /// The flavour for any request type, with the same throttle and the
    /// [`ErrorsOnly`] classifier (a classifier set before is dropped, since
    /// it judges HTTP responses).
    pub fn plain(self) -> PlainThrottleLayer {
        PlainThrottleLayer::with_handle(self.handle)
    }

    /// The throttle.
    #[must_use]
    pub fn handle(&self) -> &ThrottleHandle {
        &self.handle
    }
}

impl<S, C: Clone> Layer<S> for ThrottleLayer<C> {
    type Service = Throttle<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::with_classifier(inner, self.handle.clone(), self.classifier.clone())
    }
}

// === impl PlainThrottleLayer ===

impl PlainThrottleLayer {
    /// A layer for the throttle `handle` with the [`ErrorsOnly`]
    /// classifier.
    pub fn with_handle(handle: ThrottleHandle) -> Self {
        Self {
            handle,
            classifier: ErrorsOnly,
        }
    }
}

impl<C> PlainThrottleLayer<C> {
    /// Replaces the classifier (see [`Classify`](crate::Classify);
    /// [`classify_fn`](crate::classify::classify_fn) builds one from a
    /// closure).
    pub fn classifier<D>(self, classifier: D) -> PlainThrottleLayer<D> {
        PlainThrottleLayer {
            handle: self.handle,
            classifier,
        }
    }

    /// The throttle.
    #[must_use]
    pub fn handle(&self) -> &ThrottleHandle {
        &self.handle
    }
}

impl<S, C: Clone> Layer<S> for PlainThrottleLayer<C> {
    type Service = PlainThrottle<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PlainThrottle::with_classifier(inner, self.handle.clone(), self.classifier.clone())
    }
}
