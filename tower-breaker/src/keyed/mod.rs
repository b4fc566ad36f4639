//! One breaker per key (host, route, tenant), from a key function: the
//! three flavours of the keyed service, over a [`BreakerRegistry`].

mod future;
mod registry;

use future::CallFn;
pub use future::KeyedFuture;
use registry::{next_layer_id, Handle, HookOwner};
pub use registry::{BreakerRegistry, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_KEYS};

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::breaker::ElectionWait;
use crate::classify::{Classify, DefaultClassifier, ErrorsOnly};
use crate::future::{AnswerFuture, PlainResponseFuture, ResponseFuture};
use crate::service::{call_client, call_http, call_plain};
use crate::BoxError;
/// A key function bound to a [`BreakerRegistry`]: how the keyed services
/// pick the breaker of each request.
///
/// You do not build it yourself: the keyed layers
/// ([`KeyedBreakerLayer::new`], [`KeyedHttpBreakerLayer::new`],
/// [`KeyedPlainBreakerLayer::new`]) make it from the registry and the key
/// function. It appears in type signatures, as the `P` parameter of the
/// keyed services, the way `tower_bulkhead`'s `PerKey` does in a keyed
/// bulkhead's.
///
/// # Clone
///
/// Clones share the registry and clone the key function.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, Layer};
/// use tower_breaker::{BreakerConfig, BreakerRegistry};
/// use tower_breaker::keyed::{KeyedCircuitBreaker, PerKey};
///
/// type Inner = tower::util::ServiceFn<fn(http::Request<()>) -> std::future::Ready<Result<http::Response<()>, BoxError>>>;
/// type ByHost = fn(&http::Request<()>) -> String;
///
/// // A keyed client, named in full (say, to keep it in a struct).
/// struct Client {
///     svc: KeyedCircuitBreaker<Inner, PerKey<String, ByHost>>,
/// }
///
/// let registry = BreakerRegistry::new("upstream", BreakerConfig::new());
/// let by_host: ByHost = |req| req.uri().host().unwrap_or("unknown").to_owned();
/// let inner: Inner = service_fn(|_req| std::future::ready(Ok(http::Response::new(()))));
/// let client = Client { svc: KeyedCircuitBreaker::new(inner, registry, by_host) };
/// assert_eq!(client.svc.registry().len(), 0);
/// ```
pub struct PerKey<K, F> {
    registry: BreakerRegistry<K>,
    key: F,
}

// === impl PerKey ===

impl<K, F> PerKey<K, F> {
    fn new(registry: BreakerRegistry<K>, key: F) -> Self {
        Self { registry, key }
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.registry
    }

    /// The handle of the request's key (the known-key path, or a new key).
    #[inline]
    fn handle<Req>(&self, request: &Req) -> Arc<Handle>
    where
        F: Fn(&Req) -> K,
        K: Hash + Eq + fmt::Display,
    {
        self.registry.handle((self.key)(request))
    }
}

impl<K, F: Clone> Clone for PerKey<K, F> {
    fn clone(&self) -> Self {
        Self {
            registry: self.registry.clone(),
            key: self.key.clone(),
        }
    }
}

impl<K, F> fmt::Debug for PerKey<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKey")
            .field("registry", &self.registry)
            .field("key", &std::any::type_name::<F>())
            .finish()
    }
}

/// Wraps HTTP client services in a [`KeyedCircuitBreaker`]: one
/// [`Breaker`](crate::Breaker) per key of the request, from a [`BreakerRegistry`]; a
/// [`Layer`].
///
/// The keyed counterpart of [`BreakerLayer`](crate::BreakerLayer), with
/// the same three flavours (see [Flavours](crate#flavours)): this is the
/// client flavour (typed [`CircuitOpen`](crate::error::CircuitOpen) errors
/// and, per key, the attempt hook for a retry layer below);
/// [`http_answers`](Self::http_answers) turns it into the server flavour
/// ([`KeyedHttpBreakerLayer`]), [`plain`](Self::plain) into the one for any
/// request type ([`KeyedPlainBreakerLayer`]). The type parameter `C` is the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]).
///
/// # Keys
///
/// The key function sees each request (`Fn(&http::Request<B>) -> K`),
/// typically returning its host or route; it is typed the way
/// `tower_bulkhead`'s `BulkheadLayer::per_key` types its own
/// (`new<Req, ..>` with `F: Fn(&Req) -> K`, checked where the layer is
/// built). What differs: the breaker's key must be
/// [`Display`](fmt::Display) (it names the breaker, `"{prefix}:{key}"`, in
/// errors, events and a shared store; the bulkhead's is `Debug`) and
/// `Clone` (the registry lists its keys); the bound and the idle timeout
/// are set on the [`BreakerRegistry`], which several layers may share and
/// which shows each key's breaker, rather than on the layer.
///
/// # Clone
///
/// Clones share the registry and clone the key function and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::{BreakerConfig, BreakerRegistry, KeyedBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let registry = BreakerRegistry::new("upstream", BreakerConfig::new());
/// let by_host = |req: &http::Request<()>| req.uri().host().unwrap_or("unknown").to_owned();
/// let client = ServiceBuilder::new()
///     .layer(KeyedBreakerLayer::new(registry.clone(), by_host))
///     .service(service_fn(|_req: http::Request<()>| async {
///         Ok::<_, BoxError>(http::Response::new(()))
///     }));
/// let request = http::Request::get("http://api.example/v1").body(())?;
/// client.oneshot(request).await?;
/// assert!(registry.find(&"api.example".to_owned()).is_some());
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct KeyedBreakerLayer<K, F, C = DefaultClassifier> {
    keys: PerKey<K, F>,
    classifier: C,
    count_attempts: bool,
    layer_id: u64,
}

/// Wraps HTTP server services in a [`KeyedHttpCircuitBreaker`]: one
/// [`Breaker`](crate::Breaker) per key of the request (a route, a tenant), from a
/// [`BreakerRegistry`]; a [`Layer`] for `axum::Router::layer`.
///
/// The keyed counterpart of [`HttpBreakerLayer`](crate::HttpBreakerLayer):
/// while a key's circuit is open, its requests are answered
/// `503 Service Unavailable` with `Retry-After` and `x-tower-no-retry: 1`
/// (gRPC: a trailers-only UNAVAILABLE), and the inner error type passes
/// through unchanged. Built by [`new`](Self::new) or
/// [`KeyedBreakerLayer::http_answers`]. See [`KeyedBreakerLayer`] for the
/// key function. The type parameter `C` is the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]).
///
/// With axum, key by the route template, not by the raw path (made-up
/// paths would all be new keys): axum's `MatchedPath` request extension
/// (`req.extensions().get::<MatchedPath>()`, feature `matched-path`, on by
/// default) holds it in the services `Router::layer` wraps, or map paths to
/// `&'static str` route names yourself, as below, which allocates nothing.
///
/// # Clone
///
/// Clones share the registry and clone the key function and the classifier.
///
/// # Example
///
/// ```
/// use axum::extract::Request;
/// use axum::{routing::get, Router};
/// use tower_breaker::{BreakerConfig, BreakerRegistry};
/// use tower_breaker::keyed::KeyedHttpBreakerLayer;
///
/// let routes = BreakerRegistry::new("routes", BreakerConfig::new());
/// let by_route = |req: &Request| match req.uri().path() {
///     "/search" => "/search",
///     path if path.starts_with("/users/") => "/users/{id}",
///     _ => "other",
/// };
/// let app: Router = Router::new()
///     .route("/users/{id}", get(|| async { "user" }))
///     .route("/search", get(|| async { "results" }))
///     .layer(KeyedHttpBreakerLayer::new(routes.clone(), by_route));
/// # let _ = app;
/// ```
#[must_use]
pub struct KeyedHttpBreakerLayer<K, F, C = DefaultClassifier> {
    keys: PerKey<K, F>,
    classifier: C,
}

/// Wraps services of any request type in a [`KeyedPlainCircuitBreaker`]:
/// one [`Breaker`](crate::Breaker) per key of the request, from a [`BreakerRegistry`]; a
/// [`Layer`].
///
/// The keyed counterpart of [`PlainBreakerLayer`](crate::PlainBreakerLayer):
/// typed errors, each call counted once, no attempt hook. Built by
/// [`new`](Self::new) or [`KeyedBreakerLayer::plain`]. The key function is
/// `Fn(&Req) -> K` for the service's request type. The type parameter `C`
/// is the [classifier](crate::Classify), by default [`ErrorsOnly`] (every
/// response succeeds, errors fail).
///
/// # Clone
///
/// Clones share the registry and clone the key function and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_breaker::{BreakerConfig, BreakerRegistry};
/// use tower_breaker::keyed::KeyedPlainBreakerLayer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// // One breaker per tenant of a database call.
/// let tenants = BreakerRegistry::new("db", BreakerConfig::new());
/// let query = ServiceBuilder::new()
///     .layer(KeyedPlainBreakerLayer::new(tenants.clone(), |q: &(u32, String)| q.0))
///     .service(service_fn(|(_tenant, sql): (u32, String)| async move {
///         Ok::<_, BoxError>(sql.len())
///     }));
/// assert_eq!(query.oneshot((7, "select 1".to_owned())).await?, 8);
/// assert_eq!(tenants.find(&7).unwrap().name(), "db:7");
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct KeyedPlainBreakerLayer<K, F, C = ErrorsOnly> {
    keys: PerKey<K, F>,
    classifier: C,
}

// === impl KeyedBreakerLayer ===

impl<K, F> KeyedBreakerLayer<K, F> {
    /// A client layer that keys requests with `key` into `registry`, with
    /// the [`DefaultClassifier`], offering each key's attempt hook to a
    /// retry layer below.
    pub fn new<Req>(registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            keys: PerKey::new(registry, key),
            classifier: DefaultClassifier,
            count_attempts: true,
            layer_id: next_layer_id(),
        }
    }
}

impl<K, F, C> KeyedBreakerLayer<K, F, C> {
    /// Replaces the classifier, which judges each outcome (see
    /// [`Classify`]), for the calls and for each key's
    /// attempt hook.
    ///
    /// Each key keeps the hook of the first classifier it is used with; a
    /// second layer sharing the registry with a classifier of its own (one
    /// that is not zero-sized, or of another type) gets a hook made for
    /// each call instead, which costs one allocation per call.
    pub fn classifier<D>(self, classifier: D) -> KeyedBreakerLayer<K, F, D> {
        KeyedBreakerLayer {
            keys: self.keys,
            classifier,
            count_attempts: self.count_attempts,
            layer_id: next_layer_id(),
        }
    }

    /// Whether the layer offers each key's attempt hook to a retry layer
    /// below (default true); see
    /// [`BreakerLayer::count_attempts`](crate::BreakerLayer::count_attempts).
    pub fn count_attempts(mut self, on: bool) -> Self {
        self.count_attempts = on;
        self
    }

    /// The server flavour with the same registry, key function and
    /// classifier. The [`count_attempts`](Self::count_attempts) setting is
    /// dropped (a server counts each request once).
    pub fn http_answers(self) -> KeyedHttpBreakerLayer<K, F, C> {
        KeyedHttpBreakerLayer {
            keys: self.keys,
            classifier: self.classifier,
        }
    }

    /// The plain flavour with the same registry and key function and the
    /// [`ErrorsOnly`] classifier (a custom classifier set before is
    /// dropped, since it judges HTTP responses). Call
    /// [`classifier`](KeyedPlainBreakerLayer::classifier) afterwards to
    /// change it.
    pub fn plain(self) -> KeyedPlainBreakerLayer<K, F, ErrorsOnly> {
        KeyedPlainBreakerLayer {
            keys: self.keys,
            classifier: ErrorsOnly,
        }
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.keys.registry
    }
}

impl<K, F: Clone, C: Clone> Clone for KeyedBreakerLayer<K, F, C> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            layer_id: self.layer_id,
        }
    }
}

impl<K, F, C: fmt::Debug> fmt::Debug for KeyedBreakerLayer<K, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakerLayer")
            .field("keys", &self.keys)
            .field("classifier", &self.classifier)
            .field("count_attempts", &self.count_attempts)
            .finish_non_exhaustive()
    }
}

impl<S, K, F: Clone, C: Clone> Layer<S> for KeyedBreakerLayer<K, F, C> {
    type Service = KeyedCircuitBreaker<S, PerKey<K, F>, C>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedCircuitBreaker {
            inner,
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            layer_id: self.layer_id,
        }
    }
}

// === impl KeyedHttpBreakerLayer ===

impl<K, F> KeyedHttpBreakerLayer<K, F> {
    /// A server layer that keys requests with `key` into `registry`, with
    /// the [`DefaultClassifier`] (`5xx` and the gRPC statuses of a failing
    /// server fail, `4xx` succeed).
    pub fn new<Req>(registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            keys: PerKey::new(registry, key),
            classifier: DefaultClassifier,
        }
    }
}

impl<K, F, C> KeyedHttpBreakerLayer<K, F, C> {
    /// Replaces the classifier, which judges each response and each error
    /// of the inner service (see [`Classify`]).
    pub fn classifier<D>(self, classifier: D) -> KeyedHttpBreakerLayer<K, F, D> {
        KeyedHttpBreakerLayer {
            keys: self.keys,
            classifier,
        }
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.keys.registry
    }
}

impl<K, F: Clone, C: Clone> Clone for KeyedHttpBreakerLayer<K, F, C> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<K, F, C: fmt::Debug> fmt::Debug for KeyedHttpBreakerLayer<K, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedHttpBreakerLayer")
            .field("keys", &self.keys)
            .field("classifier", &self.classifier)
            .finish()
    }
}

impl<S, K, F: Clone, C: Clone> Layer<S> for KeyedHttpBreakerLayer<K, F, C> {
    type Service = KeyedHttpCircuitBreaker<S, PerKey<K, F>, C>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedHttpCircuitBreaker {
            inner,
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

// === impl KeyedPlainBreakerLayer ===

impl<K, F> KeyedPlainBreakerLayer<K, F> {
    /// A plain layer that keys requests with `key` into `registry`, with
    /// the [`ErrorsOnly`] classifier: every response succeeds, errors fail.
    pub fn new<Req>(registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            keys: PerKey::new(registry, key),
            classifier: ErrorsOnly,
        }
    }
}

impl<K, F, C> KeyedPlainBreakerLayer<K, F, C> {
    /// Replaces the classifier, which judges each outcome (see
    /// [`Classify`]; [`classify_fn`](crate::classify::classify_fn)
    /// builds one from a closure).
    pub fn classifier<D>(self, classifier: D) -> KeyedPlainBreakerLayer<K, F, D> {
        KeyedPlainBreakerLayer {
            keys: self.keys,
            classifier,
        }
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.keys.registry
    }
}

impl<K, F: Clone, C: Clone> Clone for KeyedPlainBreakerLayer<K, F, C> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<K, F, C: fmt::Debug> fmt::Debug for KeyedPlainBreakerLayer<K, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPlainBreakerLayer")
            .field("keys", &self.keys)
            .field("classifier", &self.classifier)
            .finish()
    }
}

impl<S, K, F: Clone, C: Clone> Layer<S> for KeyedPlainBreakerLayer<K, F, C> {
    type Service = KeyedPlainCircuitBreaker<S, PerKey<K, F>, C>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedPlainCircuitBreaker {
            inner,
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

/// Middleware for HTTP clients that picks a [`Breaker`](crate::Breaker) per request key
/// and works like [`CircuitBreaker`](crate::CircuitBreaker) with it; built
/// by [`KeyedBreakerLayer`].
///
/// `P` is the [`PerKey`] (registry and key function), `C` the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]). A
/// refused call fails with [`CircuitOpen`](crate::error::CircuitOpen) in a
/// [`BoxError`], naming the key's breaker; the inner service's errors are
/// boxed, unchanged. Each key's attempt hook is offered to a retry layer
/// below, so every attempt counts against that key's breaker.
///
/// # Clone
///
/// Clones share the registry (and so every key's breaker and hook), and
/// clone the inner service, the key function and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::error::CircuitOpen;
/// use tower_breaker::{BreakerConfig, BreakerRegistry, Mode};
/// use tower_breaker::keyed::KeyedCircuitBreaker;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let hosts = BreakerRegistry::new("hosts", BreakerConfig::new());
/// let by_host = |req: &http::Request<()>| req.uri().host().unwrap_or("").to_owned();
/// let inner = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, BoxError>(http::Response::new(()))
/// });
/// let client = KeyedCircuitBreaker::new(inner, hosts.clone(), by_host);
///
/// hosts.get(&"down.example".to_owned()).set_mode(Mode::ForcedOpen);
/// let down = http::Request::get("http://down.example/").body(())?;
/// let err = client.clone().oneshot(down).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<CircuitOpen>().unwrap().breaker(), "hosts:down.example");
///
/// let up = http::Request::get("http://up.example/").body(())?;
/// client.oneshot(up).await?;
/// # Ok(())
/// # }
/// ```
pub struct KeyedCircuitBreaker<S, P, C = DefaultClassifier> {
    inner: S,
    keys: P,
    classifier: C,
    count_attempts: bool,
    layer_id: u64,
}

/// Middleware for HTTP servers that picks a [`Breaker`](crate::Breaker) per request key
/// and works like [`HttpCircuitBreaker`](crate::HttpCircuitBreaker) with
/// it; built by [`KeyedHttpBreakerLayer`].
///
/// `P` is the [`PerKey`] (registry and key function), `C` the
/// [classifier](crate::Classify) (default [`DefaultClassifier`]). A
/// refused request is answered without calling the inner service: `503`
/// with `Retry-After` and `x-tower-no-retry: 1`, or for gRPC an HTTP 200
/// trailers-only `grpc-status: 14`. The answers have an empty body, so the
/// response body type must implement [`Default`]. The error type stays the
/// inner service's, so the layer fits `axum::Router::layer`. Each request
/// is counted once (no attempt hook).
///
/// # Clone
///
/// Clones share the registry and clone the inner service, the key function
/// and the classifier.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::{service_fn, ServiceExt};
/// use tower_breaker::{BreakerConfig, BreakerRegistry, Mode};
/// use tower_breaker::keyed::KeyedHttpCircuitBreaker;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let tenants = BreakerRegistry::new("tenants", BreakerConfig::new());
/// let by_tenant = |req: &http::Request<()>| {
///     req.headers().get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
/// };
/// let handler = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
/// });
/// let server = KeyedHttpCircuitBreaker::new(handler, tenants.clone(), by_tenant);
///
/// tenants.get(&"acme".to_owned()).set_mode(Mode::ForcedOpen);
/// let acme = http::Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(server.clone().oneshot(acme).await.unwrap().status(), 503);
/// let other = http::Request::builder().header("x-tenant", "globex").body(()).unwrap();
/// assert_eq!(server.oneshot(other).await.unwrap().status(), 200);
/// # }
/// ```
pub struct KeyedHttpCircuitBreaker<S, P, C = DefaultClassifier> {
    inner: S,
    keys: P,
    classifier: C,
}

/// Middleware for services of any request type that picks a [`Breaker`](crate::Breaker)
/// per request key and works like
/// [`PlainCircuitBreaker`](crate::PlainCircuitBreaker) with it; built by
/// [`KeyedPlainBreakerLayer`].
///
/// `P` is the [`PerKey`] (registry and key function), `C` the
/// [classifier](crate::Classify) (default [`ErrorsOnly`]). Refused calls
/// fail with [`CircuitOpen`](crate::error::CircuitOpen) in a [`BoxError`];
/// the inner service's errors are boxed, unchanged. Each call is counted
/// once (no attempt hook).
///
/// # Clone
///
/// Clones share the registry and clone the inner service, the key function
/// and the classifier.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, ServiceExt};
/// use tower_breaker::error::CircuitOpen;
/// use tower_breaker::{BreakerConfig, BreakerRegistry, Mode};
/// use tower_breaker::keyed::KeyedPlainCircuitBreaker;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let shards = BreakerRegistry::new("shard", BreakerConfig::new());
/// let lookup = service_fn(|id: u64| async move { Ok::<_, BoxError>(id * 2) });
/// let lookup = KeyedPlainCircuitBreaker::new(lookup, shards.clone(), |id: &u64| id % 4);
///
/// shards.get(&3).set_mode(Mode::ForcedOpen);
/// assert!(lookup.clone().oneshot(7).await.unwrap_err().is::<CircuitOpen>());
/// assert_eq!(lookup.oneshot(8).await?, 16);
/// # Ok(())
/// # }
/// ```
pub struct KeyedPlainCircuitBreaker<S, P, C = ErrorsOnly> {
    inner: S,
    keys: P,
    classifier: C,
}

/// The accessors every keyed flavour shares.
macro_rules! accessors {
    ($service:ident) => {
        impl<S, K, F, C> $service<S, PerKey<K, F>, C> {
            /// The registry.
            pub fn registry(&self) -> &BreakerRegistry<K> {
                &self.keys.registry
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

        impl<S: fmt::Debug, P: fmt::Debug, C: fmt::Debug> fmt::Debug for $service<S, P, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    .field("keys", &self.keys)
                    .field("classifier", &self.classifier)
                    .finish_non_exhaustive()
            }
        }
    };
}

accessors!(KeyedCircuitBreaker);
accessors!(KeyedHttpCircuitBreaker);
accessors!(KeyedPlainCircuitBreaker);

// === impl KeyedCircuitBreaker ===

impl<S, K, F> KeyedCircuitBreaker<S, PerKey<K, F>> {
    /// Wraps `inner`, keying requests with `key` into `registry`: the same
    /// as `KeyedBreakerLayer::new(registry, key).layer(inner)`.
    pub fn new<Req>(inner: S, registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            inner,
            keys: PerKey::new(registry, key),
            classifier: DefaultClassifier,
            count_attempts: true,
            layer_id: next_layer_id(),
        }
    }

    /// A layer that wraps services in a [`KeyedCircuitBreaker`]; the same
    /// as [`KeyedBreakerLayer::new`].
    pub fn layer<Req>(registry: BreakerRegistry<K>, key: F) -> KeyedBreakerLayer<K, F>
    where
        F: Fn(&Req) -> K,
    {
        KeyedBreakerLayer::new(registry, key)
    }
}

impl<S: Clone, P: Clone, C: Clone> Clone for KeyedCircuitBreaker<S, P, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
            count_attempts: self.count_attempts,
            layer_id: self.layer_id,
        }
    }
}

impl<S, K, F, C, B, RB> Service<Request<B>> for KeyedCircuitBreaker<S, PerKey<K, F>, C>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    RB: 'static,
    C: Classify<Response<RB>> + Clone,
    K: Hash + Eq + fmt::Display,
    F: Fn(&Request<B>) -> K,
{
    type Response = Response<ResponseBody<RB, C>>;
    type Error = BoxError;
    type Future = KeyedFuture<ResponseFuture<S::Future, C>, S, Request<B>, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let handle = self.keys.handle(&request);
        let layer = self.count_attempts.then_some(self.layer_id);
        keyed_call(
            handle,
            &self.classifier,
            layer,
            &mut self.inner,
            request,
            client_call,
        )
    }
}

/// The call of the client flavour on `handle`'s breaker, its attempt hook
/// offered below when `layer` is the id of a layer that counts attempts.
#[inline(always)]
fn client_call<S, C, B, RB>(
    handle: &Handle,
    classifier: &C,
    layer: Option<u64>,
    inner: &mut S,
    request: Request<B>,
) -> ResponseFuture<S::Future, C>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: 'static,
    C: Classify<Response<RB>> + Clone,
{
    let hook = layer.map(|id| {
        let owner = HookOwner::of::<C, S::Response>(id);
        handle.hook::<C, S::Response>(owner, classifier)
    });
    call_client(
        &handle.breaker,
        classifier,
        hook.as_ref().map(|hook| move || hook.get()),
        // Per key: not kept across calls.
        &mut None,
        inner,
        request,
    )
}

/// The server flavour's call on `handle`'s breaker.
#[inline]
fn http_call<S, C, B, ResB>(
    handle: &Handle,
    classifier: &C,
    _: Option<u64>,
    inner: &mut S,
    request: Request<B>,
) -> AnswerFuture<S::Future, C, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
    C: Clone,
{
    call_http(&handle.breaker, classifier, inner, request)
}

/// The plain flavour's call on `handle`'s breaker.
#[inline]
fn plain_call<S, C, Req>(
    handle: &Handle,
    classifier: &C,
    _: Option<u64>,
    inner: &mut S,
    request: Req,
) -> PlainResponseFuture<S::Future, C>
where
    S: Service<Req>,
    C: Clone,
{
    call_plain(&handle.breaker, classifier, inner, request)
}

/// A keyed call on `handle`'s breaker, made with the flavour's `call`: at
/// once, or once the key's fleet has answered (see [`KeyedFuture`]).
/// Inlined, so the flavour's call is a direct one.
#[inline(always)]
fn keyed_call<F, S: Clone, Req, C: Clone>(
    handle: Arc<Handle>,
    classifier: &C,
    layer: Option<u64>,
    inner: &mut S,
    request: Req,
    call: CallFn<F, S, Req, C>,
) -> KeyedFuture<F, S, Req, C> {
    if let Some(wait) = future::must_wait(&handle) {
        return wait_then_call(wait, handle, classifier, layer, inner, request, call);
    }
    KeyedFuture::called(call(&handle, classifier, layer, inner, request))
}

/// The future of a call that must wait for its key's fleet first: it
/// keeps the service that was made ready for it, leaving a clone in its
/// place for the next call (a clone has not been polled ready). Out of
/// line, so the calls that need no wait stay small.
#[cold]
#[inline(never)]
fn wait_then_call<F, S: Clone, Req, C: Clone>(
    wait: ElectionWait,
    handle: Arc<Handle>,
    classifier: &C,
    layer: Option<u64>,
    inner: &mut S,
    request: Req,
    call: CallFn<F, S, Req, C>,
) -> KeyedFuture<F, S, Req, C> {
    let clone = inner.clone();
    let ready = std::mem::replace(inner, clone);
    KeyedFuture::waiting(
        wait,
        handle,
        classifier.clone(),
        layer,
        ready,
        request,
        call,
    )
}

// === impl KeyedHttpCircuitBreaker ===

impl<S, K, F> KeyedHttpCircuitBreaker<S, PerKey<K, F>> {
    /// Wraps `inner`, keying requests with `key` into `registry`: the same
    /// as `KeyedHttpBreakerLayer::new(registry, key).layer(inner)`.
    pub fn new<Req>(inner: S, registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            inner,
            keys: PerKey::new(registry, key),
            classifier: DefaultClassifier,
        }
    }

    /// A layer that wraps services in a [`KeyedHttpCircuitBreaker`]; the
    /// same as [`KeyedHttpBreakerLayer::new`].
    pub fn layer<Req>(registry: BreakerRegistry<K>, key: F) -> KeyedHttpBreakerLayer<K, F>
    where
        F: Fn(&Req) -> K,
    {
        KeyedHttpBreakerLayer::new(registry, key)
    }
}

impl<S: Clone, P: Clone, C: Clone> Clone for KeyedHttpCircuitBreaker<S, P, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S, K, F, C, B, ResB> Service<Request<B>> for KeyedHttpCircuitBreaker<S, PerKey<K, F>, C>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    S::Error: std::error::Error + 'static,
    ResB: Default,
    C: Classify<Response<ResB>> + Clone,
    K: Hash + Eq + fmt::Display,
    F: Fn(&Request<B>) -> K,
{
    type Response = Response<ResponseBody<ResB, C>>;
    type Error = S::Error;
    type Future = KeyedFuture<AnswerFuture<S::Future, C, ResB>, S, Request<B>, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let handle = self.keys.handle(&request);
        keyed_call(
            handle,
            &self.classifier,
            None,
            &mut self.inner,
            request,
            http_call,
        )
    }
}

// === impl KeyedPlainCircuitBreaker ===

impl<S, K, F> KeyedPlainCircuitBreaker<S, PerKey<K, F>> {
    /// Wraps `inner`, keying requests with `key` into `registry`: the same
    /// as `KeyedPlainBreakerLayer::new(registry, key).layer(inner)`.
    pub fn new<Req>(inner: S, registry: BreakerRegistry<K>, key: F) -> Self
    where
        F: Fn(&Req) -> K,
    {
        Self {
            inner,
            keys: PerKey::new(registry, key),
            classifier: ErrorsOnly,
        }
    }

    /// A layer that wraps services in a [`KeyedPlainCircuitBreaker`]; the
    /// same as [`KeyedPlainBreakerLayer::new`].
    pub fn layer<Req>(registry: BreakerRegistry<K>, key: F) -> KeyedPlainBreakerLayer<K, F>
    where
        F: Fn(&Req) -> K,
    {
        KeyedPlainBreakerLayer::new(registry, key)
    }
}

impl<S: Clone, P: Clone, C: Clone> Clone for KeyedPlainCircuitBreaker<S, P, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S, K, F, C, Req> Service<Req> for KeyedPlainCircuitBreaker<S, PerKey<K, F>, C>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response> + Clone,
    K: Hash + Eq + fmt::Display,
    F: Fn(&Req) -> K,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedFuture<PlainResponseFuture<S::Future, C>, S, Req, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let handle = self.keys.handle(&request);
        keyed_call(
            handle,
            &self.classifier,
            None,
            &mut self.inner,
            request,
            plain_call,
        )
    }
}
