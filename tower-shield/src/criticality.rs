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
//!     async move { client.oneshot(http::Request::new(())).await }
//! });
//! let server = AcceptCriticalityLayer::new().layer(handler);
//!
//! // ...and the caller's `sheddable` reaches the dependency.
//! let request = http::Request::builder()
//!     .header(CRITICALITY_HEADER, "sheddable")
//!     .body(())?;
//! assert_eq!(server.oneshot(request).await?, "sheddable");
//! # Ok(())
//! # }
//! ```

use std::task::{Context, Poll};

use http::Request;
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
/// and runs the inner service's `call` and future in its scope, so that the
/// handler's outgoing calls inherit it ([`PropagateCriticalityLayer`]). A
/// response body streamed after the handler's future ended is outside the
/// scope.
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

impl<S, B> Service<Request<B>> for AcceptCriticality<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = TaskLocalFuture<Criticality, S::Future>;

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
        criticality.scope(future)
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
            Ok::<_, Infallible>(seen.expect("set"))
        }));
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .headers_mut()
                .insert(CRITICALITY_HEADER, h.parse().unwrap());
        }
        svc.oneshot(request).await.unwrap()
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
