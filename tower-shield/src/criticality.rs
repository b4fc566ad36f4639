//! A request's [`Criticality`] across the stacks: a server layer that reads
//! it from the caller (clamped to what the server grants) and puts it in
//! scope for the handler, and a client layer that writes it on the
//! outgoing calls the handler makes, as the deadline is.
//!
//! The layers that shed load ([`tower_bulkhead`]'s compartments) read a
//! request's criticality with [`Criticality::of`]: its extension, else the
//! one in scope, else `Critical`.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_resilience_base::criticality::{Criticality, CRITICALITY_HEADER};
//! use tower_shield::criticality::{AcceptCriticalityLayer, PropagateCriticalityLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // The dependency records what it was told.
//! let dependency = service_fn(|req: http::Request<()>| async move {
//!     let told = req.headers()[CRITICALITY_HEADER].to_str()?.to_owned();
//!     Ok::<_, tower::BoxError>(told)
//! });
//! let client = PropagateCriticalityLayer::new().layer(dependency);
//! // The handler calls it without saying anything about criticality...
//! let handler = service_fn(move |_req: http::Request<()>| {
//!     let client = client.clone();
//!     async move {
//!         let told = client.oneshot(http::Request::new(())).await?;
//!         Ok::<_, tower::BoxError>(http::Response::new(told))
//!     }
//! });
//! let server = AcceptCriticalityLayer::new().layer(handler);
//!
//! // ...and the caller's `sheddable` reaches the dependency.
//! let request = http::Request::builder()
//!     .header(CRITICALITY_HEADER, "sheddable")
//!     .body(())?;
//! let response = server.oneshot(request).await?;
//! assert_eq!(response.body().get_ref(), "sheddable");
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower_layer::Layer;
use tower_resilience_base::criticality::{Criticality, CRITICALITY_HEADER};
use tower_service::Service;

/// Server side: reads each request's criticality and puts it in scope.
///
/// For each request it takes the criticality already in its extensions
/// (set by a layer of this process), else the caller's `x-criticality`
/// header clamped to [`max`](Self::max) (by default `Critical`: no caller
/// can claim `CriticalPlus` unless the server grants it), else
/// [`default`](Self::default_criticality); it stores it in the extensions
/// and runs the inner service's `call`, its future and its response body
/// in its scope, so that the handler's outgoing calls inherit it
/// ([`PropagateCriticalityLayer`]), those a streamed body makes while it is
/// read included (as the server deadline's scope covers the body).
///
/// # Example
///
/// ```
/// use tower_resilience_base::criticality::Criticality;
/// use tower_shield::criticality::AcceptCriticalityLayer;
///
/// // Internal callers may claim `critical-plus`; a request that says
/// // nothing is treated as `sheddable-plus`.
/// let layer = AcceptCriticalityLayer::new()
///     .max(Criticality::CriticalPlus)
///     .default_criticality(Criticality::SheddablePlus);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct AcceptCriticalityLayer {
    max: Criticality,
    default: Criticality,
}

/// The service of an [`AcceptCriticalityLayer`].
#[derive(Debug, Clone)]
pub struct AcceptCriticality<S> {
    inner: S,
    max: Criticality,
    default: Criticality,
}

/// Client side: writes the request's criticality on the wire.
///
/// When the request has no `x-criticality` header and a criticality is
/// known (the request's extension, else the one in scope of the request
/// being served), the header is set to it. Nothing is written for a
/// request whose criticality nobody set: the dependency applies its own
/// default.
///
/// # Example
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_shield::criticality::PropagateCriticalityLayer;
///
/// let client = ServiceBuilder::new()
///     .layer(PropagateCriticalityLayer::new())
///     .service(tower::service_fn(|_req: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(())
///     }));
/// # let _ = client;
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use]
pub struct PropagateCriticalityLayer {
    _priv: (),
}

/// The service of a [`PropagateCriticalityLayer`].
#[derive(Debug, Clone)]
pub struct PropagateCriticality<S> {
    inner: S,
}

// === impl AcceptCriticalityLayer ===

impl AcceptCriticalityLayer {
    /// Grants callers at most `Critical`; requests without the header are
    /// `Critical`.
    pub fn new() -> Self {
        Self {
            max: Criticality::Critical,
            default: Criticality::Critical,
        }
    }

    /// The most a caller's header may claim (default `Critical`); higher
    /// claims are lowered to it.
    pub fn max(mut self, max: Criticality) -> Self {
        self.max = max;
        self
    }

    /// The criticality of a request without a (valid) header (default
    /// `Critical`). It is not clamped by [`max`](Self::max): it is the
    /// server's own choice.
    pub fn default_criticality(mut self, default: Criticality) -> Self {
        self.default = default;
        self
    }
}

impl Default for AcceptCriticalityLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for AcceptCriticalityLayer {
    type Service = AcceptCriticality<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AcceptCriticality {
            inner,
            max: self.max,
            default: self.default,
        }
    }
}

// === impl AcceptCriticality ===

impl<S, B, ResB> Service<Request<B>> for AcceptCriticality<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<CriticalityBody<ResB>>;
    type Error = S::Error;
    type Future = AcceptFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let criticality = Criticality::from_extensions(request.extensions()).unwrap_or_else(|| {
            Criticality::from_headers(request.headers())
                .map_or(self.default, |claimed| claimed.clamp(self.max))
        });
        request.extensions_mut().insert(criticality);
        let inner = &mut self.inner;
        let future = criticality.sync_scope(|| inner.call(request));
        AcceptFuture {
            inner: criticality.scope(future),
            criticality,
        }
    }
}

pin_project! {
    /// The response future of [`AcceptCriticality`]: the inner future,
    /// polled with the request's criticality in scope; its response's body
    /// is polled in the same scope ([`CriticalityBody`]).
    #[must_use = "futures do nothing unless polled"]
    pub struct AcceptFuture<F> {
        #[pin]
        inner: TaskLocalFuture<Criticality, F>,
        criticality: Criticality,
    }
}

impl<F, ResB, E> Future for AcceptFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<CriticalityBody<ResB>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let criticality = *this.criticality;
        this.inner
            .poll(cx)
            .map_ok(|response| response.map(|inner| CriticalityBody { inner, criticality }))
    }
}

impl<F> std::fmt::Debug for AcceptFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptFuture")
            .field("criticality", &self.criticality)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The response body of [`AcceptCriticality`]: each poll runs with the
    /// request's criticality in scope, so that a body streamed after the
    /// handler returned (a server stream, frames produced by calls the body
    /// makes as it is read) makes its outgoing calls with the caller's
    /// criticality, as the handler does. (A task the handler spawns to
    /// feed the body runs outside any request's scope: it needs
    /// [`Criticality::scope`] of its own.)
    ///
    /// # Example
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use futures_util::StreamExt;
    /// use http_body_util::{BodyExt, StreamBody};
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_resilience_base::criticality::{Criticality, CRITICALITY_HEADER};
    /// use tower_shield::criticality::AcceptCriticalityLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// // A body whose one frame says which criticality was in scope when
    /// // it was read, long after the handler returned.
    /// let handler = service_fn(|_req: http::Request<()>| async {
    ///     let frames = futures_util::stream::poll_fn(|_cx| {
    ///         let seen = Criticality::current().map_or("none", Criticality::as_str);
    ///         std::task::Poll::Ready(Some(Ok::<_, Infallible>(
    ///             http_body::Frame::data(bytes::Bytes::from(seen)),
    ///         )))
    ///     })
    ///     .take(1);
    ///     Ok::<_, Infallible>(http::Response::new(StreamBody::new(frames)))
    /// });
    /// let server = AcceptCriticalityLayer::new().layer(handler);
    /// let request = http::Request::builder()
    ///     .header(CRITICALITY_HEADER, "sheddable")
    ///     .body(())?;
    /// let response = server.oneshot(request).await?;
    /// let body = response.into_body().collect().await?.to_bytes();
    /// assert_eq!(body, "sheddable");
    /// # Ok(())
    /// # }
    /// ```
    pub struct CriticalityBody<B> {
        #[pin]
        inner: B,
        criticality: Criticality,
    }
}

impl<B> CriticalityBody<B> {
    /// The criticality its polls run with.
    #[must_use]
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// The inner body.
    #[must_use]
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body, unwrapped.
    #[must_use]
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for CriticalityBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let inner = this.inner;
        this.criticality.sync_scope(|| inner.poll_frame(cx))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> std::fmt::Debug for CriticalityBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriticalityBody")
            .field("criticality", &self.criticality)
            .finish_non_exhaustive()
    }
}

// === impl PropagateCriticalityLayer ===

impl PropagateCriticalityLayer {
    /// The client layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for PropagateCriticalityLayer {
    type Service = PropagateCriticality<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateCriticality { inner }
    }
}

// === impl PropagateCriticality ===

impl<S> PropagateCriticality<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for PropagateCriticality<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // The criticality first: most clients run outside any scope and
        // carry no extension, and then the header map is not searched.
        if let Some(c) =
            Criticality::from_extensions(request.extensions()).or_else(Criticality::current)
        {
            if !request.headers().contains_key(CRITICALITY_HEADER) {
                request
                    .headers_mut()
                    .insert(CRITICALITY_HEADER, c.header_value());
            }
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{service_fn, ServiceExt};

    use super::*;

    async fn granted(layer: AcceptCriticalityLayer, header: Option<&str>) -> Criticality {
        let svc = layer.layer(service_fn(|req: Request<()>| async move {
            let seen = Criticality::from_extensions(req.extensions());
            assert_eq!(seen, Criticality::current(), "extension and scope agree");
            Ok::<_, Infallible>(http::Response::new(seen.expect("set")))
        }));
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .headers_mut()
                .insert(CRITICALITY_HEADER, h.parse().unwrap());
        }
        svc.oneshot(request).await.unwrap().into_body().into_inner()
    }

    /// A body streamed after the handler returned makes its outgoing call
    /// (through `PropagateCriticality`) with the caller's criticality: the
    /// body is read in the request's scope, as the handler runs.
    #[tokio::test(flavor = "current_thread")]
    async fn a_streamed_body_calls_out_with_the_callers_criticality() {
        use futures_util::StreamExt;
        use http_body_util::{BodyExt, StreamBody};

        let dependency =
            PropagateCriticalityLayer::new().layer(service_fn(|req: Request<()>| async move {
                let told = req.headers().get(CRITICALITY_HEADER).cloned();
                Ok::<_, Infallible>(
                    told.map_or_else(String::new, |v| v.to_str().unwrap_or_default().to_owned()),
                )
            }));
        let handler = service_fn(move |_req: Request<()>| {
            let dependency = dependency.clone();
            async move {
                // The call is made when the body is read, not before.
                let frames = futures_util::stream::once(async move {
                    let told = dependency.oneshot(Request::new(())).await?;
                    Ok::<_, Infallible>(Frame::data(bytes::Bytes::from(told)))
                })
                .boxed();
                Ok::<_, Infallible>(http::Response::new(StreamBody::new(frames)))
            }
        });
        let server = AcceptCriticalityLayer::new().layer(handler);
        let mut request = Request::new(());
        request
            .headers_mut()
            .insert(CRITICALITY_HEADER, "sheddable".parse().unwrap());
        let response = server.oneshot(request).await.unwrap();
        assert_eq!(response.body().criticality(), Criticality::Sheddable);
        assert_eq!(Criticality::current(), None, "nothing in scope out here");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "sheddable", "the dependency was told");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_caller_cannot_claim_more_than_the_server_grants() {
        let layer = AcceptCriticalityLayer::new();
        assert_eq!(
            granted(layer, Some("critical-plus")).await,
            Criticality::Critical
        );
        assert_eq!(
            granted(layer, Some("sheddable")).await,
            Criticality::Sheddable
        );
        assert_eq!(granted(layer, None).await, Criticality::Critical);
        assert_eq!(granted(layer, Some("bogus")).await, Criticality::Critical);
        let trusting = layer
            .max(Criticality::CriticalPlus)
            .default_criticality(Criticality::SheddablePlus);
        assert_eq!(
            granted(trusting, Some("critical-plus")).await,
            Criticality::CriticalPlus
        );
        assert_eq!(granted(trusting, None).await, Criticality::SheddablePlus);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_client_writes_what_is_known_and_nothing_else() {
        let svc =
            PropagateCriticalityLayer::new().layer(service_fn(|req: Request<()>| async move {
                Ok::<_, Infallible>(req.headers().get(CRITICALITY_HEADER).cloned())
            }));
        let plain = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(plain, None, "nobody set one");
        let mut marked = Request::new(());
        marked.extensions_mut().insert(Criticality::SheddablePlus);
        let told = svc.clone().oneshot(marked).await.unwrap();
        assert_eq!(told.unwrap(), "sheddable-plus");
        let scoped = Criticality::Sheddable
            .scope(svc.clone().oneshot(Request::new(())))
            .await
            .unwrap();
        assert_eq!(scoped.unwrap(), "sheddable");
        let mut explicit = Request::new(());
        explicit
            .headers_mut()
            .insert(CRITICALITY_HEADER, "critical".parse().unwrap());
        let kept = Criticality::Sheddable
            .scope(svc.oneshot(explicit))
            .await
            .unwrap();
        assert_eq!(kept.unwrap(), "critical", "an explicit header is kept");
    }
}
