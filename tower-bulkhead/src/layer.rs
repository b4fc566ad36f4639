use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use tower_layer::Layer;

use crate::adaptive::controller::LimitSpec;
use crate::adaptive::LimitAlgorithm;
use crate::compartment::{CompartmentHandle, Shedding, WaitPolicy};
use crate::partition::{KeyedConfig, KeyedHandle, PerKey, Single};
use crate::release::{BodyEnd, Head, Release};
use crate::service::{Bulkhead, HttpBulkhead};
use crate::{DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_KEYS};
use tower_resilience_base::Name;

/// The default `Retry-After` of the HTTP answer: one second.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Caps the calls in flight through the services it wraps and refuses the
/// rest at once with a typed error; a [`Layer`] that produces
/// [`Bulkhead`].
///
/// The compartment (or, with [`per_key`](Self::per_key), the registry of
/// compartments) is created here, in the constructor, and shared by every
/// service this layer wraps: `layer` may be called once per connection, as
/// `axum::serve` does, and all connections still share one limit.
///
/// Defaults: no waiting (`max_wait` off; with it, at most `limit` waiters
/// per compartment, see [`max_waiters`](Self::max_waiters)), one
/// compartment.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::BulkheadLayer;
///
/// // At most 32 calls to the payments service at once; a call that finds
/// // them all busy may wait up to 5 ms for a slot (at most 8 such calls
/// // at once), then fails.
/// let layer = BulkheadLayer::new("payments", 32)
///     .max_wait(Duration::from_millis(5))
///     .max_waiters(8);
/// let handle = layer.handle();
/// assert_eq!(handle.in_flight(), 0);
/// assert_eq!(handle.limit(), 32);
/// ```
///
/// # Clone
///
/// Clones share the compartments (and so the limit and the counters). The
/// setters that shape compartments ([`per_key`](Self::per_key),
/// [`max_keys`](BulkheadLayer::max_keys),
/// [`idle_timeout`](BulkheadLayer::idle_timeout),
/// [`fallback_limit`](BulkheadLayer::fallback_limit)) start afresh with new
/// ones: configure first, then clone, wrap and take [`handle`](Self::handle)s.
#[must_use]
pub struct BulkheadLayer<K = Single, M = Head> {
    partition: K,
    wait: WaitPolicy,
    shedding: Shedding,
    _release: PhantomData<fn() -> M>,
}

/// Like [`BulkheadLayer`], for HTTP servers: a full compartment is answered
/// with `503 Service Unavailable` (gRPC: RESOURCE_EXHAUSTED) instead of an
/// error; a [`Layer`] that produces [`HttpBulkhead`].
///
/// The `M` parameter says when a call's slot is given back:
/// [`Head`] (the default) when the response head is ready, [`BodyEnd`]
/// (after [`hold_until_body_end`](Self::hold_until_body_end)) when the
/// response body has been sent or dropped.
///
/// Defaults: no waiting (with `max_wait`, at most `limit` waiters per
/// compartment), one compartment, `Retry-After: 1`
/// ([`DEFAULT_RETRY_AFTER`]), release at [`Head`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_bulkhead::HttpBulkheadLayer;
///
/// let layer = HttpBulkheadLayer::new("api", 256)
///     .retry_after(Duration::from_secs(2))
///     .hold_until_body_end();
/// assert_eq!(layer.handle().limit(), 256);
/// ```
///
/// # Clone
///
/// As for [`BulkheadLayer`]: clones share the compartments.
#[must_use]
pub struct HttpBulkheadLayer<K = Single, M = Head> {
    inner: BulkheadLayer<K>,
    retry_after_secs: u64,
    _release: PhantomData<fn() -> M>,
}

// === impl BulkheadLayer ===

impl BulkheadLayer<Single, Head> {
    /// A layer with one compartment named `name` that lets at most `limit`
    /// calls through at once.
    ///
    /// The name identifies the compartment in errors, answers' logs and
    /// handles; use the dependency's name. A `limit` of zero refuses every
    /// call (a kill switch).
    pub fn new(name: impl Into<Name>, limit: usize) -> Self {
        Self::with_spec(name.into(), LimitSpec::Fixed(limit))
    }

    /// A layer with one compartment named `name` whose limit adapts to
    /// the dependency: `algorithm` moves it from the latency and the
    /// congestion its calls experience (see the [`adaptive`](crate::adaptive)
    /// module). It starts at the algorithm's initial limit and stays
    /// within its bounds.
    ///
    /// Everything else is as with [`new`](Self::new): calls over the
    /// limit are refused at once with
    /// [`BulkheadFull`](crate::error::BulkheadFull) (whose `limit` is the
    /// limit at that moment), and the layer works with
    /// [`per_key`](Self::per_key) (each key's compartment learns its own
    /// limit, from its own clone of `algorithm`; the fallback compartment
    /// too, unless [`fallback_limit`](BulkheadLayer::fallback_limit) fixes
    /// it), [`max_wait`](Self::max_wait),
    /// [`hold_until_body_end`](Self::hold_until_body_end) (the latency of
    /// a call then runs to the end of its body) and [`http`](Self::http).
    ///
    /// # Example
    ///
    /// ```
    /// use tower::{service_fn, BoxError, ServiceExt};
    /// use tower_bulkhead::adaptive::Aimd;
    /// use tower_bulkhead::BulkheadLayer;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// let layer = BulkheadLayer::adaptive("payments", Aimd::new().initial(8).bounds(2, 64));
    /// let handle = layer.handle();
    /// let payments = layer.layer(service_fn(|n: u32| async move { Ok::<_, BoxError>(n) }));
    /// assert_eq!(payments.oneshot(7).await?, 7);
    /// assert_eq!(handle.limit(), 8);
    /// assert_eq!(handle.stats().limit_bounds(), Some((2, 64)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn adaptive<A>(name: impl Into<Name>, algorithm: A) -> Self
    where
        A: LimitAlgorithm + Clone,
    {
        Self::with_spec(name.into(), LimitSpec::adaptive(algorithm))
    }

    fn with_spec(name: Name, spec: LimitSpec) -> Self {
        Self {
            partition: Single::new(name, spec),
            wait: WaitPolicy::default(),
            shedding: Shedding::DEFAULT,
            _release: PhantomData,
        }
    }
}

impl<M> BulkheadLayer<Single, M> {
    /// One compartment per key instead of one for all: `key_fn` computes
    /// the key of each request (a host, a route, a tenant), and every key
    /// gets its own compartment of the same `limit`, so a saturated key
    /// leaves the others untouched.
    ///
    /// The number of live compartments is bounded (see
    /// [`max_keys`](BulkheadLayer::max_keys)); idle ones are evicted after
    /// [`idle_timeout`](BulkheadLayer::idle_timeout), and past the bound new
    /// keys share a fallback compartment. See
    /// [`KeyedHandle`](crate::KeyedHandle) for the details.
    ///
    /// Keyed selection takes a short lock and reads the clock on every
    /// call; it allocates only if `key_fn` does (prefer keys that are cheap
    /// to build, like `&'static str` route names or a cloned
    /// `http::uri::Authority`).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_bulkhead::BulkheadLayer;
    ///
    /// let layer = BulkheadLayer::new("upstream", 16)
    ///     .per_key(|req: &http::Request<()>| req.uri().host().map(str::to_owned))
    ///     .max_keys(100);
    /// let handle = layer.handle();
    /// assert!(handle.is_empty());
    /// ```
    pub fn per_key<Req, F, Q>(self, key_fn: F) -> BulkheadLayer<PerKey<F, Q>, M>
    where
        F: Fn(&Req) -> Q,
        Q: Hash + Eq + fmt::Debug,
    {
        let limit = self.partition.spec();
        let config = KeyedConfig {
            name: self.partition.name(),
            limit: limit.clone(),
            max_keys: DEFAULT_MAX_KEYS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            fallback_limit: limit,
        };
        BulkheadLayer {
            partition: PerKey::new(key_fn, config),
            wait: self.wait,
            shedding: self.shedding,
            _release: PhantomData,
        }
    }

    /// A view of the compartment's counters, shared with every service
    /// this layer wraps.
    #[must_use]
    pub fn handle(&self) -> CompartmentHandle {
        self.partition.handle()
    }
}

impl<F, Q, M> BulkheadLayer<PerKey<F, Q>, M>
where
    Q: Hash + Eq,
{
    /// The most keyed compartments alive at once (default
    /// [`DEFAULT_MAX_KEYS`], 1024). New keys past it share the fallback
    /// compartment. Zero sends every request to the fallback.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.partition = self.partition.reconfigure(|c| c.max_keys = max_keys);
        self
    }

    /// How long a keyed compartment with no call in flight or waiting
    /// must go unused before it may be evicted (default
    /// [`DEFAULT_IDLE_TIMEOUT`], 60 s). Eviction forgets its counters.
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.partition = self.partition.reconfigure(|c| c.idle_timeout = idle);
        self
    }

    /// The limit of the fallback compartment shared by new keys once
    /// `max_keys` compartments are alive (default: the per-key limit; for
    /// an adaptive layer, an adaptive fallback with its own clone of the
    /// algorithm). A fixed number here makes the fallback fixed.
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.partition = self
            .partition
            .reconfigure(|c| c.fallback_limit = LimitSpec::Fixed(limit));
        self
    }

    /// A view of the keyed compartments and the fallback, shared with every
    /// service this layer wraps.
    #[must_use]
    pub fn handle(&self) -> KeyedHandle<Q> {
        self.partition.handle()
    }
}

impl<K, M> BulkheadLayer<K, M> {
    /// Keep each call's slot until its HTTP response body has been read to
    /// its end, has failed, or has been dropped, instead of giving it back
    /// when the response head is ready: a body that streams (or stalls)
    /// still occupies the dependency, and the bulkhead's count says so.
    /// The service then takes `http::Request`s and answers
    /// `http::Response<`[`ResponseBody<B>`](crate::body::ResponseBody)`>`.
    ///
    /// It costs one pointer in the response body and nothing per frame; a
    /// caller that keeps a response without reading or dropping its body
    /// keeps the slot, as it keeps the dependency's connection.
    /// `tower_shield::client_stack` builds its bulkhead this way.
    ///
    /// # Example
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tower::{service_fn, BoxError, Layer, ServiceExt};
    /// use tower_bulkhead::BulkheadLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// let layer = BulkheadLayer::new("catalog", 8).hold_until_body_end();
    /// let handle = layer.handle();
    /// let svc = layer.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, BoxError>(http::Response::new(String::from("items")))
    /// }));
    ///
    /// let response = svc.oneshot(http::Request::new(())).await?;
    /// assert_eq!(handle.in_flight(), 1, "the body is not read yet");
    /// let body = response.into_body().collect().await?.to_bytes();
    /// assert_eq!(body, "items");
    /// assert_eq!(handle.in_flight(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_until_body_end(self) -> BulkheadLayer<K, BodyEnd> {
        self.release::<BodyEnd>()
    }

    /// Give each call's slot back as soon as the response head is ready
    /// (or the call failed, or its future was dropped): the default of
    /// [`BulkheadLayer::new`], and the only mode for responses that are not
    /// `http::Response`s. Undoes [`hold_until_body_end`](Self::hold_until_body_end).
    pub fn release_at_head(self) -> BulkheadLayer<K, Head> {
        self.release::<Head>()
    }

    /// This layer in release mode `N` ([`Head`] or [`BodyEnd`]), for code
    /// generic over the mode; the same as
    /// [`release_at_head`](Self::release_at_head) or
    /// [`hold_until_body_end`](Self::hold_until_body_end).
    pub fn with_release<N: Release>(self) -> BulkheadLayer<K, N> {
        self.release::<N>()
    }

    fn release<N>(self) -> BulkheadLayer<K, N> {
        BulkheadLayer {
            partition: self.partition,
            wait: self.wait,
            shedding: self.shedding,
            _release: PhantomData,
        }
    }

    /// The share of the limit each criticality may use, least important
    /// first: `[Sheddable, SheddablePlus, Critical, CriticalPlus]`
    /// (default `[0.5, 0.75, 1.0, 1.0]`). A request of criticality `c`
    /// takes a slot only while fewer than `share(c) * limit` calls
    /// (rounded up) are in flight, so as a compartment fills, sheddable
    /// requests are refused first and critical ones keep the last slots.
    /// A refused request fails with [`BulkheadFull`](crate::error::BulkheadFull)
    /// at once (it never waits, even with [`max_wait`](Self::max_wait))
    /// and is counted in [`Stats::shed`](crate::Stats::shed).
    ///
    /// Shares are brought into `[0, 1]` (NaN: 1). The criticality of a
    /// request is looked up only once the compartment is past the lowest
    /// share, so most calls never pay for it; see the crate docs,
    /// "Criticality", for where it is read from.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_bulkhead::BulkheadLayer;
    ///
    /// // Batch traffic (sheddable) gets at most 10% of the 100 slots.
    /// let layer = BulkheadLayer::new("search", 100).criticality_shares([0.1, 0.5, 1.0, 1.0]);
    /// # let _ = layer;
    /// ```
    pub fn criticality_shares(mut self, shares: [f64; 4]) -> Self {
        self.shedding = Shedding::from_shares(shares);
        self
    }

    /// Turns criticality shedding off: every request may use the whole
    /// limit, whatever its criticality, and none is looked up.
    pub fn without_criticality_shedding(mut self) -> Self {
        self.shedding = Shedding::OFF;
        self
    }

    /// Lets a call that finds its compartment full wait up to `max_wait`
    /// for a slot before it is refused (default: no waiting, refuse at
    /// once). The wait happens in the response future, never in
    /// `poll_ready`. Zero means no waiting.
    ///
    /// The wait is bounded in time *and* in number: at most
    /// [`max_waiters`](Self::max_waiters) calls (by default the
    /// compartment's limit) wait per compartment at once, and a call that
    /// finds them all taken is refused at once.
    ///
    /// Waiting needs a clone of the inner service (the one made ready for
    /// the call is kept for it), hence the `S: Clone` bound on the service.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.wait.max_wait = Some(max_wait);
        self
    }

    /// The most calls that may wait for a slot of one compartment at once
    /// (default: the compartment's limit). Only matters with
    /// [`max_wait`](Self::max_wait).
    ///
    /// A call that finds its compartment full takes a waiter place in
    /// `call` and waits up to `max_wait`; a call that finds the compartment
    /// full *and* all `max_waiters` places taken is refused at once with
    /// [`BulkheadFull`](crate::error::BulkheadFull), whose
    /// [`waited`](crate::error::BulkheadFull::waited) is zero. A place is
    /// given back when its call gets a slot, times out, or its response
    /// future is dropped. The bound is exact under any number of racing
    /// calls (one compare-and-swap takes a place), and
    /// [`Stats::waiting`](crate::Stats::waiting) shows the places taken.
    ///
    /// With [`per_key`](Self::per_key), every compartment (each key's and
    /// the fallback) gets its own `max_waiters` places; by default each
    /// one's bound is its own limit (the fallback's is `fallback_limit`).
    /// Zero turns waiting off. The bound belongs to this layer value, like
    /// `max_wait`: it does not create new compartments, so handles taken
    /// before stay valid.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
    /// use tower_bulkhead::error::BulkheadFull;
    /// use tower_bulkhead::BulkheadLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), BoxError> {
    /// // A dependency that hangs until we say so.
    /// let (recover, recovered) = tokio::sync::watch::channel(false);
    /// let dependency = service_fn(move |n: u32| {
    ///     let mut recovered = recovered.clone();
    ///     async move {
    ///         recovered.wait_for(|up| *up).await?;
    ///         Ok::<_, BoxError>(n)
    ///     }
    /// });
    ///
    /// // One slot; one call may wait for it, for up to a minute.
    /// let layer = BulkheadLayer::new("inventory", 1)
    ///     .max_wait(Duration::from_secs(60))
    ///     .max_waiters(1);
    /// let handle = layer.handle();
    /// let mut client = ServiceBuilder::new().layer(layer).service(dependency);
    ///
    /// let first = tokio::spawn(client.ready().await?.call(1)); // takes the slot
    /// let second = tokio::spawn(client.ready().await?.call(2)); // waits
    /// assert_eq!((handle.in_flight(), handle.waiting()), (1, 1));
    ///
    /// // The slot and the waiter place are taken: refused at once.
    /// let err = client.ready().await?.call(3).await.unwrap_err();
    /// let full = err.downcast_ref::<BulkheadFull>().unwrap();
    /// assert_eq!(full.waited(), Duration::ZERO);
    ///
    /// recover.send(true)?;
    /// assert_eq!(first.await??, 1);
    /// assert_eq!(second.await??, 2);
    /// assert_eq!((handle.in_flight(), handle.waiting()), (0, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.wait.max_waiters = Some(max_waiters);
        self
    }

    /// The HTTP flavour of this layer, with the same compartments: full
    /// compartments answer `503` (gRPC: RESOURCE_EXHAUSTED) instead of
    /// failing. See [`HttpBulkheadLayer`].
    pub fn http(self) -> HttpBulkheadLayer<K, M> {
        HttpBulkheadLayer {
            inner: self.release_at_head(),
            retry_after_secs: DEFAULT_RETRY_AFTER.as_secs(),
            _release: PhantomData,
        }
    }
}

impl<S, K: Clone, M> Layer<S> for BulkheadLayer<K, M> {
    type Service = Bulkhead<S, K, M>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::from_parts(inner, self.partition.clone(), self.wait, self.shedding)
    }
}

impl<K: Clone, M> Clone for BulkheadLayer<K, M> {
    fn clone(&self) -> Self {
        Self {
            partition: self.partition.clone(),
            wait: self.wait,
            shedding: self.shedding,
            _release: PhantomData,
        }
    }
}

impl<K: fmt::Debug, M> fmt::Debug for BulkheadLayer<K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("partition", &self.partition)
            .field("max_wait", &self.wait.max_wait)
            .field("max_waiters", &self.wait.max_waiters)
            .field("criticality_shares", &self.shedding.as_fractions())
            .field("release", &std::any::type_name::<M>())
            .finish()
    }
}

// === impl HttpBulkheadLayer ===

impl HttpBulkheadLayer<Single, Head> {
    /// An HTTP layer with one compartment named `name` that lets at most
    /// `limit` requests through at once; the same as
    /// `BulkheadLayer::new(name, limit).http()`.
    pub fn new(name: impl Into<Name>, limit: usize) -> Self {
        BulkheadLayer::new(name, limit).http()
    }

    /// An HTTP layer with one compartment whose limit adapts to the
    /// dependency; the same as `BulkheadLayer::adaptive(name,
    /// algorithm).http()`. See [`BulkheadLayer::adaptive`]. Besides
    /// dropped and timed-out calls, responses `503` and `504` (gRPC:
    /// RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) count as congestion.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_bulkhead::adaptive::Gradient;
    /// use tower_bulkhead::HttpBulkheadLayer;
    ///
    /// let layer = HttpBulkheadLayer::adaptive("api", Gradient::new());
    /// assert_eq!(layer.handle().limit(), 20);
    /// ```
    pub fn adaptive<A>(name: impl Into<Name>, algorithm: A) -> Self
    where
        A: LimitAlgorithm + Clone,
    {
        BulkheadLayer::adaptive(name, algorithm).http()
    }
}

impl<M> HttpBulkheadLayer<Single, M> {
    /// One compartment per key; see [`BulkheadLayer::per_key`].
    ///
    /// # Example
    ///
    /// ```
    /// use tower_bulkhead::HttpBulkheadLayer;
    ///
    /// // One compartment of 8 per tenant, named by a request header.
    /// let layer = HttpBulkheadLayer::new("tenants", 8).per_key(|req: &http::Request<()>| {
    ///     req.headers().get("x-tenant").cloned()
    /// });
    /// # let _ = layer;
    /// ```
    pub fn per_key<Req, F, Q>(self, key_fn: F) -> HttpBulkheadLayer<PerKey<F, Q>, M>
    where
        F: Fn(&Req) -> Q,
        Q: Hash + Eq + fmt::Debug,
    {
        HttpBulkheadLayer {
            inner: self.inner.per_key(key_fn),
            retry_after_secs: self.retry_after_secs,
            _release: PhantomData,
        }
    }

    /// A view of the compartment's counters; see
    /// [`BulkheadLayer::handle`].
    #[must_use]
    pub fn handle(&self) -> CompartmentHandle {
        self.inner.handle()
    }
}

impl<F, Q, M> HttpBulkheadLayer<PerKey<F, Q>, M>
where
    Q: Hash + Eq,
{
    /// See [`BulkheadLayer::max_keys`].
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.inner = self.inner.max_keys(max_keys);
        self
    }

    /// See [`BulkheadLayer::idle_timeout`].
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.inner = self.inner.idle_timeout(idle);
        self
    }

    /// See [`BulkheadLayer::fallback_limit`].
    pub fn fallback_limit(mut self, limit: usize) -> Self {
        self.inner = self.inner.fallback_limit(limit);
        self
    }

    /// A view of the keyed compartments; see [`KeyedHandle`].
    #[must_use]
    pub fn handle(&self) -> KeyedHandle<Q> {
        self.inner.handle()
    }
}

impl<K, M> HttpBulkheadLayer<K, M> {
    /// See [`BulkheadLayer::max_wait`]. A request that waited in vain gets
    /// the same answer as one refused at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.inner = self.inner.max_wait(max_wait);
        self
    }

    /// The most requests that may wait for a slot of one compartment at
    /// once (default: the compartment's limit); see
    /// [`BulkheadLayer::max_waiters`]. A request that finds the compartment
    /// full and every waiter place taken is answered at once, with the same
    /// 503 (gRPC: RESOURCE_EXHAUSTED) as any other refusal.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_bulkhead::HttpBulkheadLayer;
    ///
    /// // 64 requests at once; up to 16 more may wait 10 ms for a slot.
    /// let layer = HttpBulkheadLayer::new("api", 64)
    ///     .max_wait(Duration::from_millis(10))
    ///     .max_waiters(16);
    /// assert_eq!(layer.handle().waiting(), 0);
    /// ```
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.inner = self.inner.max_waiters(max_waiters);
        self
    }

    /// See [`BulkheadLayer::criticality_shares`]. The HTTP flavour reads a
    /// request's criticality from its extensions, then from the task-local
    /// scope (`Criticality::of`).
    pub fn criticality_shares(mut self, shares: [f64; 4]) -> Self {
        self.inner = self.inner.criticality_shares(shares);
        self
    }

    /// See [`BulkheadLayer::without_criticality_shedding`].
    pub fn without_criticality_shedding(mut self) -> Self {
        self.inner = self.inner.without_criticality_shedding();
        self
    }

    /// The `Retry-After` of the 503 answer (default
    /// [`DEFAULT_RETRY_AFTER`], one second), rounded up to whole seconds as
    /// the header requires. gRPC answers carry it as `grpc-retry-pushback-ms` instead.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after_secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        self
    }

    /// Keep each request's slot until its response body has been sent to
    /// the end, has failed, or has been dropped, instead of releasing it
    /// when the response head is ready. Use it when the body streams from
    /// the dependency, so that the slot covers the whole time the
    /// dependency is busy. The response body becomes
    /// [`ResponseBody<B>`](crate::body::ResponseBody).
    pub fn hold_until_body_end(self) -> HttpBulkheadLayer<K, BodyEnd> {
        self.with_release::<BodyEnd>()
    }

    /// This layer in release mode `N` ([`Head`] or [`BodyEnd`]), for code
    /// generic over the mode.
    pub fn with_release<N: Release>(self) -> HttpBulkheadLayer<K, N> {
        HttpBulkheadLayer {
            inner: self.inner,
            retry_after_secs: self.retry_after_secs,
            _release: PhantomData,
        }
    }
}

impl<S, K: Clone, M> Layer<S> for HttpBulkheadLayer<K, M> {
    type Service = HttpBulkhead<S, K, M>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpBulkhead::from_parts(
            inner,
            self.inner.partition.clone(),
            self.inner.wait,
            self.inner.shedding,
            self.retry_after_secs,
        )
    }
}

impl<K: Clone, M> Clone for HttpBulkheadLayer<K, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            retry_after_secs: self.retry_after_secs,
            _release: PhantomData,
        }
    }
}

impl<K: fmt::Debug, M> fmt::Debug for HttpBulkheadLayer<K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpBulkheadLayer")
            .field("partition", &self.inner.partition)
            .field("max_wait", &self.inner.wait.max_wait)
            .field("max_waiters", &self.inner.wait.max_waiters)
            .field("criticality_shares", &self.inner.shedding.as_fractions())
            .field("retry_after_secs", &self.retry_after_secs)
            .field("release", &std::any::type_name::<M>())
            .finish()
    }
}
