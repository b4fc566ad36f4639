//! One breaker per key (host, route, tenant), from a key function, in a
//! bounded registry.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_resilience_base::hook::AttemptHook;
use tower_service::Service;

use crate::breaker::{nanos, Breaker};
use crate::classify::{Classify, DefaultClassifier};
use crate::config::BreakerConfig;
use crate::future::ResponseFuture;
use crate::hook::BreakerHook;
use crate::service::call_client;
use crate::{BoxError, Mode, State};

/// The default most keys in a [`BreakerRegistry`]: 1,024.
pub const DEFAULT_MAX_KEYS: usize = 1024;
/// The default idle time after which a closed breaker may be evicted to
/// make room: 10 minutes.
pub const DEFAULT_IDLE_EVICTION: Duration = Duration::from_secs(600);

/// A bounded map from keys to [`Breaker`]s, all built from one
/// configuration.
///
/// Each key gets its own breaker, named `"{prefix}:{key}"`, the first time
/// it is seen. The registry holds at most `max_keys` breakers, so hostile
/// input (random hosts or paths) cannot grow memory. When it is full, a new
/// key first evicts breakers that are closed and have not been used for
/// `idle_eviction`; if none can go, the key shares the registry's
/// *overflow* breaker (named `"{prefix}:overflow"`), which trips for all
/// such keys together, and a `circuit_registry_full` event is emitted.
/// Open and half-open breakers, and breakers in a manual mode, are never
/// evicted, so an outage cannot be forgotten by flooding the registry.
///
/// Lookups take a read lock on the map (a write lock only to insert), and
/// read the clock once to mark the breaker used.
///
/// # Clone
///
/// Clones share the map (one `Arc`).
///
/// # Example
///
/// ```
/// use tower_breaker::{BreakerConfig, BreakerRegistry, Mode, State};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = BreakerRegistry::new("hosts", BreakerConfig::new()).max_keys(2);
/// let a = registry.get(&"a.example".to_owned());
/// assert_eq!(a.name(), "hosts:a.example");
/// a.set_mode(Mode::ForcedOpen);
/// let b = registry.get(&"b.example".to_owned());
/// assert_eq!(b.snapshot().state, State::Closed);
/// // Full, and nothing may be evicted yet: the overflow breaker.
/// assert_eq!(registry.get(&"c.example".to_owned()).name(), "hosts:overflow");
/// assert_eq!(registry.len(), 2);
/// # }
/// ```
pub struct BreakerRegistry<K> {
    inner: Arc<Registry<K>>,
}

struct Registry<K> {
    prefix: Arc<str>,
    config: BreakerConfig,
    max_keys: usize,
    idle_ns: u64,
    base: Instant,
    map: RwLock<HashMap<K, Entry>>,
    overflow: Breaker,
    overflow_hook: Arc<dyn AttemptHook>,
    full_events: AtomicU64,
}

struct Entry {
    breaker: Breaker,
    /// The key's attempt hook (default classifier), shared by its calls.
    hook: Arc<dyn AttemptHook>,
    last_used_ns: AtomicU64,
}

fn hook_of(breaker: &Breaker) -> Arc<dyn AttemptHook> {
    Arc::new(BreakerHook::<DefaultClassifier, http::Response<()>>::new(
        breaker.clone(),
        DefaultClassifier,
    ))
}

// === impl BreakerRegistry ===

impl<K> BreakerRegistry<K>
where
    K: Hash + Eq + Clone + fmt::Display,
{
    /// An empty registry whose breakers are named `"{prefix}:{key}"` and
    /// built from `config`, with at most [`DEFAULT_MAX_KEYS`] keys and
    /// [`DEFAULT_IDLE_EVICTION`].
    pub fn new(prefix: impl Into<Arc<str>>, config: BreakerConfig) -> Self {
        let prefix = prefix.into();
        let overflow = Breaker::with_config(format!("{prefix}:overflow"), config.clone());
        let overflow_hook = hook_of(&overflow);
        Self {
            inner: Arc::new(Registry {
                prefix,
                config,
                max_keys: DEFAULT_MAX_KEYS,
                idle_ns: nanos(DEFAULT_IDLE_EVICTION),
                base: Instant::now(),
                map: RwLock::new(HashMap::new()),
                overflow,
                overflow_hook,
                full_events: AtomicU64::new(0),
            }),
        }
    }

    /// The most keys (default 1,024; at least 1). Only takes effect on a
    /// registry that has not been cloned yet.
    #[must_use]
    pub fn max_keys(mut self, max: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.max_keys = max.max(1);
        }
        self
    }

    /// How long a closed breaker must have been unused before a new key may
    /// evict it (default 10 minutes). Only takes effect on a registry that
    /// has not been cloned yet.
    #[must_use]
    pub fn idle_eviction(mut self, idle: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.idle_ns = nanos(idle);
        }
        self
    }

    /// The breaker of `key`, created if needed (or the overflow breaker
    /// when the registry is full).
    pub fn get(&self, key: &K) -> Breaker {
        self.get_hooked(key).0
    }

    /// The breaker of `key` and its attempt hook.
    pub(crate) fn get_hooked(&self, key: &K) -> (Breaker, Arc<dyn AttemptHook>) {
        let r = &*self.inner;
        let now = nanos(Instant::now().saturating_duration_since(r.base));
        {
            let map = r.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = map.get(key) {
                entry.last_used_ns.store(now, Relaxed);
                return (entry.breaker.clone(), Arc::clone(&entry.hook));
            }
        }
        let mut map = r.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get(key) {
            return (entry.breaker.clone(), Arc::clone(&entry.hook));
        }
        if map.len() >= r.max_keys {
            map.retain(|_, e| {
                let idle = now.saturating_sub(e.last_used_ns.load(Relaxed)) >= r.idle_ns;
                let s = e.breaker.snapshot();
                !(idle && s.state == State::Closed && s.mode == Mode::Automatic)
            });
        }
        if map.len() >= r.max_keys {
            if r.full_events.fetch_add(1, Relaxed).is_multiple_of(1024) {
                tracing::warn!(
                    registry = %r.prefix,
                    max_keys = r.max_keys,
                    "circuit_registry_full"
                );
            }
            return (r.overflow.clone(), Arc::clone(&r.overflow_hook));
        }
        let breaker = Breaker::with_config(format!("{}:{key}", r.prefix), r.config.clone());
        let hook = hook_of(&breaker);
        map.insert(
            key.clone(),
            Entry {
                breaker: breaker.clone(),
                hook: Arc::clone(&hook),
                last_used_ns: AtomicU64::new(now),
            },
        );
        (breaker, hook)
    }

    /// The breaker of `key`, if it has one (never the overflow breaker).
    #[must_use]
    pub fn find(&self, key: &K) -> Option<Breaker> {
        let map = self.inner.map.read().unwrap_or_else(|e| e.into_inner());
        map.get(key).map(|e| e.breaker.clone())
    }

    /// The breaker shared by keys that found the registry full.
    #[must_use]
    pub fn overflow(&self) -> &Breaker {
        &self.inner.overflow
    }

    /// How many keys have a breaker.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.map.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no key has a breaker yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key's breaker, for dashboards.
    #[must_use]
    pub fn breakers(&self) -> Vec<(K, Breaker)> {
        let map = self.inner.map.read().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(k, e)| (k.clone(), e.breaker.clone()))
            .collect()
    }
}

impl<K> Clone for BreakerRegistry<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for BreakerRegistry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.inner.map.read().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("BreakerRegistry")
            .field("prefix", &self.inner.prefix)
            .field("keys", &keys)
            .field("max_keys", &self.inner.max_keys)
            .finish()
    }
}

/// Wraps services in a [`KeyedCircuitBreaker`]: one breaker per key of the
/// request, from a [`BreakerRegistry`]; a [`Layer`].
///
/// The key function sees each HTTP request (`Fn(&http::Request<B>) -> K`),
/// typically returning its host or route. The services work like
/// [`CircuitBreaker`](crate::CircuitBreaker) (the client flavour) with the
/// [`DefaultClassifier`] (typed errors, the attempt hook).
///
/// # Clone
///
/// Clones share the registry.
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
/// let by_host = |req: &http::Request<()>| {
///     req.uri().host().unwrap_or("unknown").to_owned()
/// };
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
pub struct KeyedBreakerLayer<K, F> {
    registry: BreakerRegistry<K>,
    key: F,
}

/// Middleware that picks a [`Breaker`] per request key; see
/// [`KeyedBreakerLayer`].
///
/// # Clone
///
/// Clones share the registry and clone the inner service and the key
/// function.
pub struct KeyedCircuitBreaker<S, K, F> {
    inner: S,
    registry: BreakerRegistry<K>,
    key: F,
}

// === impl KeyedBreakerLayer ===

impl<K, F> KeyedBreakerLayer<K, F> {
    /// A layer that keys requests with `key` into `registry`.
    pub fn new(registry: BreakerRegistry<K>, key: F) -> Self {
        Self { registry, key }
    }

    /// The registry.
    #[must_use]
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.registry
    }
}

impl<K, F: Clone> Clone for KeyedBreakerLayer<K, F> {
    fn clone(&self) -> Self {
        Self {
            registry: self.registry.clone(),
            key: self.key.clone(),
        }
    }
}

impl<K, F> fmt::Debug for KeyedBreakerLayer<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakerLayer")
            .field("registry", &self.registry)
            .field("key", &std::any::type_name::<F>())
            .finish()
    }
}

impl<S, K, F: Clone> Layer<S> for KeyedBreakerLayer<K, F> {
    type Service = KeyedCircuitBreaker<S, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedCircuitBreaker {
            inner,
            registry: self.registry.clone(),
            key: self.key.clone(),
        }
    }
}

// === impl KeyedCircuitBreaker ===

impl<S, K, F> KeyedCircuitBreaker<S, K, F> {
    /// The registry.
    pub fn registry(&self) -> &BreakerRegistry<K> {
        &self.registry
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

impl<S: Clone, K, F: Clone> Clone for KeyedCircuitBreaker<S, K, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            registry: self.registry.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S: fmt::Debug, K, F> fmt::Debug for KeyedCircuitBreaker<S, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCircuitBreaker")
            .field("inner", &self.inner)
            .field("registry", &self.registry)
            .finish()
    }
}

impl<S, K, F, B> Service<Request<B>> for KeyedCircuitBreaker<S, K, F>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    DefaultClassifier: Classify<S::Response>,
    K: Hash + Eq + Clone + fmt::Display,
    F: Fn(&Request<B>) -> K,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, DefaultClassifier>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (breaker, hook) = self.registry.get_hooked(&(self.key)(&request));
        call_client(
            &breaker,
            &DefaultClassifier,
            Some(&hook),
            &mut self.inner,
            request,
        )
    }
}
