//! The layers and services.

use std::task::{Context, Poll};

use http::header::HOST;
use http::{Request, Response};
use tower_layer::Layer;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::{Answer, BoxError};
use tower_service::Service;

use crate::body::FaultBody;
use crate::error::InjectedFault;
use crate::future::{mark, Pending, PlainResponseFuture, ResponseFuture};
use crate::handle::FaultHandle;
use crate::plan::{Action, FaultKind};

/// Injects the faults of a [`FaultHandle`]'s plan into HTTP (and gRPC)
/// calls: latency, errors, statuses, hangs and aborted response bodies.
///
/// Put it where the real dependency's faults would come from: innermost,
/// just above the transport (the client), so that every layer above
/// (deadline, breaker, retry, bulkhead, fallback) meets the injected
/// faults as it would meet real ones. On a server, outermost under the
/// stack, it plays a failing handler.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_chaos::{FaultHandle, FaultLayer, FaultPlan, INJECTED_FAULT_HEADER};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let faults = FaultHandle::new("catalog");
/// let client = FaultLayer::new(faults.clone()).layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, BoxError>(http::Response::new(String::from("42")))
/// }));
///
/// // Off: nothing changes.
/// let response = client.clone().oneshot(http::Request::new(())).await?;
/// assert!(response.headers().get(INJECTED_FAULT_HEADER).is_none());
///
/// // Every call answered 503, marked as injected.
/// faults.set(FaultPlan::new().status(1.0, http::StatusCode::SERVICE_UNAVAILABLE))?;
/// let response = client.oneshot(http::Request::new(())).await?;
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()[INJECTED_FAULT_HEADER], "status");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FaultLayer {
    handle: FaultHandle,
}

impl FaultLayer {
    /// A layer injecting `handle`'s faults.
    #[must_use]
    pub fn new(handle: FaultHandle) -> Self {
        Self { handle }
    }

    /// The same faults for services whose requests are not HTTP.
    #[must_use]
    pub fn plain(self) -> PlainFaultLayer {
        PlainFaultLayer {
            handle: self.handle,
        }
    }

    /// The handle.
    #[must_use]
    pub fn handle(&self) -> &FaultHandle {
        &self.handle
    }
}

impl<S> Layer<S> for FaultLayer {
    type Service = FaultInjection<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultInjection {
            inner,
            handle: self.handle.clone(),
        }
    }
}

/// The service of [`FaultLayer`]. Its errors are the service's, boxed,
/// or an [`InjectedFault`]; its response body is a [`FaultBody`].
///
/// While its handle is off, a call costs one atomic load and passes
/// through. `poll_ready` is the service's (a hang or an error is injected
/// in `call`, after readiness, as a dependency would).
#[derive(Debug, Clone)]
pub struct FaultInjection<S> {
    inner: S,
    handle: FaultHandle,
}

impl<S> FaultInjection<S> {
    /// Wraps `inner` in `handle`'s faults.
    pub fn new(inner: S, handle: FaultHandle) -> Self {
        Self { inner, handle }
    }

    /// The handle.
    pub fn handle(&self) -> &FaultHandle {
        &self.handle
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The key of a request, for [`FaultPlan::only_keys`](crate::FaultPlan::only_keys):
/// its URI's host, else its `Host` header without the port.
fn key<B>(request: &Request<B>) -> Option<&str> {
    request.uri().host().or_else(|| {
        let host = request.headers().get(HOST)?.to_str().ok()?;
        Some(match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        })
    })
}

impl<S, B, ResBody> Service<Request<B>> for FaultInjection<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<FaultBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, ResBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(injection) = self.handle.draw(Criticality::of(&request), key(&request)) else {
            return ResponseFuture::called(self.inner.call(request), None);
        };
        let layer = || self.handle.name().into();
        let delay = injection.delay;
        match injection.action {
            Action::Error => ResponseFuture::held(
                delay,
                Err(Box::new(InjectedFault::new(layer(), FaultKind::Error))),
            ),
            Action::Hang(max) => ResponseFuture::held(
                Some(delay.unwrap_or_default().saturating_add(max)),
                Err(Box::new(InjectedFault::new(layer(), FaultKind::Hang))),
            ),
            Action::Status(status, grpc) => {
                let mut response = Answer::new(status, grpc, "injected fault")
                    .service_called()
                    .into_response_for(request.headers());
                mark(&mut response, FaultKind::Status);
                if delay.is_some() {
                    mark(&mut response, FaultKind::Latency);
                }
                ResponseFuture::held(delay, Ok(response))
            }
            Action::Abort(after) => ResponseFuture::called(
                self.inner.call(request),
                Some(Box::new(Pending {
                    delay,
                    abort: Some(after),
                    layer: layer(),
                })),
            ),
            Action::None => ResponseFuture::called(
                self.inner.call(request),
                Some(Box::new(Pending {
                    delay,
                    abort: None,
                    layer: layer(),
                })),
            ),
        }
    }
}

/// [`FaultLayer`] for services of any request type: latency, errors and
/// hangs; a status or an aborted body of the plan fails the call with an
/// [`InjectedFault`] of that kind instead (there is no response head or
/// body to put them in). A call's criticality is the one in scope
/// ([`Criticality::current`]), else `Critical`; it has no key, so a plan
/// with [`only_keys`](crate::FaultPlan::only_keys) injects nothing here.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_chaos::{is_injected, FaultHandle, FaultLayer, FaultPlan};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let faults = FaultHandle::new("lookup");
/// faults.set(FaultPlan::new().error(1.0)).unwrap();
/// let lookup = FaultLayer::new(faults)
///     .plain()
///     .layer(service_fn(|id: u32| async move { Ok::<_, BoxError>(id) }));
/// let error = lookup.oneshot(7).await.unwrap_err();
/// assert!(is_injected(&*error));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PlainFaultLayer {
    handle: FaultHandle,
}

impl PlainFaultLayer {
    /// A layer injecting `handle`'s faults.
    #[must_use]
    pub fn new(handle: FaultHandle) -> Self {
        Self { handle }
    }
}

impl<S> Layer<S> for PlainFaultLayer {
    type Service = PlainFaultInjection<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PlainFaultInjection {
            inner,
            handle: self.handle.clone(),
        }
    }
}

/// The service of [`PlainFaultLayer`].
#[derive(Debug, Clone)]
pub struct PlainFaultInjection<S> {
    inner: S,
    handle: FaultHandle,
}

impl<S> PlainFaultInjection<S> {
    /// Wraps `inner` in `handle`'s faults.
    pub fn new(inner: S, handle: FaultHandle) -> Self {
        Self { inner, handle }
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for PlainFaultInjection<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = PlainResponseFuture<S::Future, S::Response>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        let criticality = Criticality::current().unwrap_or_default();
        let Some(injection) = self.handle.draw(criticality, None) else {
            return PlainResponseFuture::called(self.inner.call(request), None);
        };
        let fail = |kind| -> Result<S::Response, BoxError> {
            Err(Box::new(InjectedFault::new(self.handle.name(), kind)))
        };
        let delay = injection.delay;
        match injection.action {
            Action::None => PlainResponseFuture::called(self.inner.call(request), delay),
            Action::Error => PlainResponseFuture::held(delay, fail(FaultKind::Error)),
            Action::Status(..) => PlainResponseFuture::held(delay, fail(FaultKind::Status)),
            Action::Abort(_) => PlainResponseFuture::held(delay, fail(FaultKind::AbortBody)),
            Action::Hang(max) => PlainResponseFuture::held(
                Some(delay.unwrap_or_default().saturating_add(max)),
                fail(FaultKind::Hang),
            ),
        }
    }
}
