use std::fmt;
use std::marker::PhantomData;
use std::mem;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::compartment::{Admission, Shedding, WaitPolicy};
use crate::future::{HttpResponseFuture, ResponseFuture};
use crate::layer::{BulkheadLayer, HttpBulkheadLayer};
use crate::partition::{Partition, Single};
use crate::release::{BodyEnd, Head, Release};
use crate::BoxError;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::grpc::is_grpc;
use tower_resilience_base::Name;

/// Middleware that caps the calls in flight to the inner service and
/// refuses the rest at once with [`BulkheadFull`](crate::error::BulkheadFull).
///
/// For each call it takes a slot of the request's compartment in `call`;
/// if none is free it fails at once, or, when `max_wait` is set and one of
/// the compartment's `max_waiters` waiter places is free, waits up to
/// `max_wait` inside the response future. The slot is held by the response future and released
/// when it completes or is dropped.
///
/// `poll_ready` only forwards the inner service's readiness; see the crate
/// docs, "Readiness".
///
/// # Clone
///
/// Clones share the compartments (limit, counters) and clone the inner
/// service.
pub struct Bulkhead<S, K = Single, M = Head> {
    inner: S,
    partition: K,
    wait: WaitPolicy,
    shedding: Shedding,
    _release: PhantomData<fn() -> M>,
}

/// Middleware that caps the requests in flight to the inner HTTP service
/// and answers the rest with `503 Service Unavailable`, or for gRPC requests
/// a trailers-only RESOURCE_EXHAUSTED.
///
/// The 503 carries `Retry-After` (whole seconds) and
/// [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER)`: 1`; the gRPC answer (HTTP
/// 200, `content-type: application/grpc`, `grpc-status: 8`, `grpc-message:
/// bulkhead full`) carries the no-retry mark too. The error type stays the
/// inner service's, so it fits `axum::Router::layer`; the response body
/// type must implement [`Default`] (the answers have an empty body), as
/// axum's and tonic's bodies do.
///
/// With the [`BodyEnd`](crate::release::BodyEnd) release mode the slot is
/// kept by the response body until it has been sent or dropped.
///
/// # Clone
///
/// Clones share the compartments (limit, counters) and clone the inner
/// service.
pub struct HttpBulkhead<S, K = Single, M = Head> {
    inner: S,
    partition: K,
    wait: WaitPolicy,
    shedding: Shedding,
    retry_after_secs: u64,
    _release: PhantomData<fn() -> M>,
}

// === impl Bulkhead ===

impl<S> Bulkhead<S, Single> {
    /// Wraps `inner` in a new compartment named `name` with room for
    /// `limit` calls; the same as `BulkheadLayer::new(name, limit).layer(inner)`.
    pub fn new(inner: S, name: impl Into<Name>, limit: usize) -> Self {
        tower_layer::Layer::layer(&BulkheadLayer::new(name, limit), inner)
    }

    /// A layer that wraps services in [`Bulkhead`]; the same as
    /// [`BulkheadLayer::new`].
    pub fn layer(name: impl Into<Name>, limit: usize) -> BulkheadLayer {
        BulkheadLayer::new(name, limit)
    }
}

impl<S, K, M> Bulkhead<S, K, M> {
    pub(crate) fn from_parts(inner: S, partition: K, wait: WaitPolicy, shedding: Shedding) -> Self {
        Self {
            inner,
            partition,
            wait,
            shedding,
            _release: PhantomData,
        }
    }

    /// The admission of one call: the response future that carries it.
    /// `criticality` reads the request's criticality, only if the
    /// compartment is past the lowest share.
    #[inline]
    fn admit<Req>(
        &mut self,
        request: Req,
        criticality: fn(&Req) -> Criticality,
    ) -> ResponseFuture<S, Req, M>
    where
        S: Service<Req> + Clone,
        K: Partition<Req>,
    {
        let (wait, shedding) = (self.wait, self.shedding);
        let admission = self.partition.with_compartment(&request, |c| {
            Admission::decide(c, wait, shedding, || criticality(&request))
        });
        match admission {
            Admission::Go(permit) => ResponseFuture::called(self.inner.call(request), permit),
            Admission::Wait(acquire) => {
                let ready = take_ready(&mut self.inner);
                ResponseFuture::waiting(acquire, ready, request)
            }
            Admission::Full(error) => ResponseFuture::rejected(error),
        }
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, Req> Service<Req> for Bulkhead<S, K, Head>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: Partition<Req>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        self.admit(request, |_| Criticality::current().unwrap_or_default())
    }
}

impl<S, K, ReqBody, B> Service<Request<ReqBody>> for Bulkhead<S, K, BodyEnd>
where
    S: Service<Request<ReqBody>, Response = Response<B>> + Clone,
    S::Error: Into<BoxError>,
    K: Partition<Request<ReqBody>>,
{
    type Response = Response<ResponseBody<B>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, Request<ReqBody>, BodyEnd>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.admit(request, Criticality::of)
    }
}

impl<S: Clone, K: Clone, M> Clone for Bulkhead<S, K, M> {
    fn clone(&self) -> Self {
        Self::from_parts(
            self.inner.clone(),
            self.partition.clone(),
            self.wait,
            self.shedding,
        )
    }
}

impl<S: fmt::Debug, K: fmt::Debug, M> fmt::Debug for Bulkhead<S, K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("inner", &self.inner)
            .field("partition", &self.partition)
            .field("max_wait", &self.wait.max_wait)
            .field("max_waiters", &self.wait.max_waiters)
            .finish()
    }
}

/// Takes the service that was made ready for this call, leaving a clone in
/// its place (which the next `poll_ready` drives), so a waiting call can
/// call it later.
fn take_ready<S: Clone>(service: &mut S) -> S {
    let clone = service.clone();
    mem::replace(service, clone)
}

// === impl HttpBulkhead ===

impl<S> HttpBulkhead<S, Single, Head> {
    /// Wraps `inner` in a new compartment named `name` with room for
    /// `limit` requests; the same as
    /// `HttpBulkheadLayer::new(name, limit).layer(inner)`.
    pub fn new(inner: S, name: impl Into<Name>, limit: usize) -> Self {
        tower_layer::Layer::layer(&HttpBulkheadLayer::new(name, limit), inner)
    }

    /// A layer that wraps services in [`HttpBulkhead`]; the same as
    /// [`HttpBulkheadLayer::new`].
    pub fn layer(name: impl Into<Name>, limit: usize) -> HttpBulkheadLayer {
        HttpBulkheadLayer::new(name, limit)
    }
}

impl<S, K, M> HttpBulkhead<S, K, M> {
    pub(crate) fn from_parts(
        inner: S,
        partition: K,
        wait: WaitPolicy,
        shedding: Shedding,
        retry_after_secs: u64,
    ) -> Self {
        Self {
            inner,
            partition,
            wait,
            shedding,
            retry_after_secs,
            _release: PhantomData,
        }
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, M, ReqBody, B> Service<Request<ReqBody>> for HttpBulkhead<S, K, M>
where
    S: Service<Request<ReqBody>, Response = Response<B>> + Clone,
    B: Default,
    K: Partition<Request<ReqBody>>,
    M: Release,
{
    type Response = Response<M::Body<B>>;
    type Error = S::Error;
    type Future = HttpResponseFuture<S, Request<ReqBody>, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (wait, shedding) = (self.wait, self.shedding);
        let admission = self.partition.with_compartment(&request, |c| {
            Admission::decide(c, wait, shedding, || Criticality::of(&request))
        });
        match admission {
            Admission::Go(permit) => HttpResponseFuture::called(self.inner.call(request), permit),
            Admission::Wait(acquire) => {
                let grpc = is_grpc(request.headers());
                let ready = take_ready(&mut self.inner);
                HttpResponseFuture::waiting(acquire, ready, request, grpc, self.retry_after_secs)
            }
            Admission::Full(error) => {
                let grpc = is_grpc(request.headers());
                HttpResponseFuture::rejected(error, grpc, self.retry_after_secs)
            }
        }
    }
}

impl<S: Clone, K: Clone, M> Clone for HttpBulkhead<S, K, M> {
    fn clone(&self) -> Self {
        Self::from_parts(
            self.inner.clone(),
            self.partition.clone(),
            self.wait,
            self.shedding,
            self.retry_after_secs,
        )
    }
}

impl<S: fmt::Debug, K: fmt::Debug, M> fmt::Debug for HttpBulkhead<S, K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpBulkhead")
            .field("inner", &self.inner)
            .field("partition", &self.partition)
            .field("max_wait", &self.wait.max_wait)
            .field("max_waiters", &self.wait.max_waiters)
            .field("retry_after_secs", &self.retry_after_secs)
            .field("release", &std::any::type_name::<M>())
            .finish()
    }
}
