//! The services: [`Throttle`] for `http::Request`s, [`PlainThrottle`] for
//! any request type.

use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::outcome::{Classify, ErrorsOnly};
use tower_service::Service;

use super::classify::ThrottleClassifier;
use super::future::ResponseFuture;
use super::handle::ThrottleHandle;
use super::layer::{PlainThrottleLayer, ThrottleLayer};
use crate::BoxError;

/// Client-side adaptive throttling of HTTP (and gRPC) calls: rejects each
/// request locally with the probability the SRE book's rule gives for its
/// [`Criticality`] ([`Criticality::of`]: the request's extension, else the
/// one in scope, else `Critical`), and counts what the dependency accepted.
///
/// Built by [`ThrottleLayer`]; see the [module docs](super) for the rule.
/// Rejected requests fail at once with
/// [`Throttled`](tower_resilience_base::error::Throttled) in a
/// [`BoxError`], without calling the inner service; the inner service's
/// errors are boxed, unchanged. The response is judged at its head by the
/// classifier (default [`ThrottleClassifier`]).
///
/// # Readiness
///
/// `poll_ready` forwards the inner service's readiness; the decision is
/// taken in `call` (a "reject" design, like the breaker's).
///
/// # Clone
///
/// Clones share the [`ThrottleHandle`] (one `Arc`) and clone the inner
/// service and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::throttle::{Throttle, ThrottleHandle};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let inner = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, BoxError>(http::Response::new(()))
/// });
/// let handle = ThrottleHandle::new("users");
/// let response = Throttle::new(inner, handle.clone()).oneshot(http::Request::new(())).await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(handle.snapshot().accepts, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Throttle<S, C = ThrottleClassifier> {
    inner: S,
    /// `None`: a pass-through ([`Throttle::pass_through`]).
    handle: Option<ThrottleHandle>,
    classifier: C,
}

/// Client-side adaptive throttling of calls of any request type: the
/// [`Throttle`] for services whose requests are not `http::Request`s. A
/// call's criticality is the one in scope ([`Criticality::current`], set
/// by a server layer or by [`Criticality::scope`]), else `Critical`.
///
/// Built by [`PlainThrottleLayer`] (or [`ThrottleLayer::plain`]). The
/// classifier defaults to [`ErrorsOnly`] (every response is an accept,
/// errors are not, local rejections from below are ignored).
///
/// # Clone
///
/// Clones share the [`ThrottleHandle`] (one `Arc`) and clone the inner
/// service and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::throttle::{PlainThrottle, ThrottleHandle};
/// use tower_resilience_base::criticality::Criticality;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let lookup = service_fn(|id: u32| async move { Ok::<_, BoxError>(id * 2) });
/// let handle = ThrottleHandle::new("lookup");
/// let lookup = PlainThrottle::new(lookup, handle.clone());
/// // A prefetch: sheddable, it is rejected first when the dependency struggles.
/// let doubled = Criticality::Sheddable.scope(lookup.oneshot(21)).await?;
/// assert_eq!(doubled, 42);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PlainThrottle<S, C = ErrorsOnly> {
    inner: S,
    /// `None`: a pass-through ([`Throttle::pass_through`]).
    handle: Option<ThrottleHandle>,
    classifier: C,
}

macro_rules! accessors {
    ($service:ident, $layer:ident, $default:ident) => {
        impl<S> $service<S, $default> {
            /// Wraps `inner` in the throttle `handle`, with the default
            /// classifier.
            pub fn new(inner: S, handle: ThrottleHandle) -> Self {
                Self {
                    inner,
                    handle: Some(handle),
                    classifier: $default,
                }
            }

            /// Wraps `inner` in no throttle: every call goes through and
            /// nothing is counted. It is what a stack whose throttle is
            /// chosen at run time builds when none is chosen
            /// (`tower_shield::stack::ClientStack::optional_throttle`), so
            /// that its type is the same either way. It costs a layer (one
            /// more future around the inner one, moved with it); a stack
            /// that never throttles should leave the layer out.
            ///
            /// # Example
            ///
            /// ```
            #[doc = concat!("use tower_breaker::throttle::", stringify!($service), ";")]
            ///
            #[doc = concat!("let off = ", stringify!($service), "::pass_through(());")]
            /// assert!(off.handle().is_none());
            /// ```
            pub fn pass_through(inner: S) -> Self {
                Self {
                    inner,
                    handle: None,
                    classifier: $default,
                }
            }

            /// The layer that wraps services in this throttle: the same as
            #[doc = concat!("[`", stringify!($layer), "::with_handle`].")]
            pub fn layer(handle: ThrottleHandle) -> $layer {
                $layer::with_handle(handle)
            }
        }

        impl<S, C> $service<S, C> {
            /// Wraps `inner` in the throttle `handle`, judging outcomes
            /// with `classifier`.
            pub fn with_classifier(inner: S, handle: ThrottleHandle, classifier: C) -> Self {
                Self {
                    inner,
                    handle: Some(handle),
                    classifier,
                }
            }

            /// The throttle, for snapshots (`None` for a
            #[doc = concat!("[`pass_through`](", stringify!($service), "::pass_through)).")]
            #[must_use]
            pub fn handle(&self) -> Option<&ThrottleHandle> {
                self.handle.as_ref()
            }

            /// The inner service.
            #[must_use]
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            #[must_use]
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// The inner service, unwrapped.
            #[must_use]
            pub fn into_inner(self) -> S {
                self.inner
            }
        }

        impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for $service<S, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    .field("throttle", &self.handle.as_ref().map(ThrottleHandle::name))
                    .field("classifier", &self.classifier)
                    .finish()
            }
        }
    };
}

accessors!(Throttle, ThrottleLayer, ThrottleClassifier);
accessors!(PlainThrottle, PlainThrottleLayer, ErrorsOnly);

impl<S, C, B, ResBody> Service<Request<B>> for Throttle<S, C>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    C: Classify<Response<ResBody>> + Clone,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(handle) = &self.handle else {
            return ResponseFuture::passed(self.inner.call(request), self.classifier.clone());
        };
        match handle.try_acquire(Criticality::of(&request)) {
            Ok(permit) => {
                ResponseFuture::called(self.inner.call(request), permit, self.classifier.clone())
            }
            Err(throttled) => ResponseFuture::rejected(throttled),
        }
    }
}

impl<S, C, Req> Service<Req> for PlainThrottle<S, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        let Some(handle) = &self.handle else {
            return ResponseFuture::passed(self.inner.call(request), self.classifier.clone());
        };
        let criticality = Criticality::current().unwrap_or_default();
        match handle.try_acquire(criticality) {
            Ok(permit) => {
                ResponseFuture::called(self.inner.call(request), permit, self.classifier.clone())
            }
            Err(throttled) => ResponseFuture::rejected(throttled),
        }
    }
}
