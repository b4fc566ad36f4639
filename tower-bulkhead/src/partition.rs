//! How requests are mapped to compartments: one for all ([`Single`]) or one
//! per key ([`PerKey`]), with a bounded registry.
//!
//! You do not build these types yourself: [`BulkheadLayer::new`] gives a
//! [`Single`] compartment and [`BulkheadLayer::per_key`] turns it into a
//! [`PerKey`] partition. They appear in type signatures, as the `K`
//! parameter of [`BulkheadLayer`], [`Bulkhead`](crate::Bulkhead) and their
//! HTTP counterparts.
//!
//! [`BulkheadLayer`]: crate::BulkheadLayer
//! [`BulkheadLayer::new`]: crate::BulkheadLayer::new
//! [`BulkheadLayer::per_key`]: crate::BulkheadLayer::per_key

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::adaptive::controller::LimitSpec;
use crate::compartment::{millis_since, Compartment, CompartmentHandle, Stats};
use crate::metrics::CompartmentMetrics;
use tower_resilience_base::Name;

/// The default bound on live keyed compartments: 1024.
pub const DEFAULT_MAX_KEYS: usize = 1024;

/// The default time after which an unused keyed compartment may be evicted:
/// 60 seconds.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Picks the compartment of a request. Sealed: implemented by [`Single`]
/// and [`PerKey`] only.
pub trait Partition<Req>: sealed::Select<Req> {}

/// One compartment shared by every request: the partition of
/// [`BulkheadLayer::new`](crate::BulkheadLayer::new).
///
/// Selecting it takes no lock and allocates nothing.
///
/// # Clone
///
/// Clones share the compartment.
#[derive(Clone)]
pub struct Single {
    compartment: Arc<Compartment>,
    /// How it was made, for `per_key` to make one per key alike.
    spec: LimitSpec,
}

/// One compartment per key, computed from each request by a key function;
/// the partition of [`BulkheadLayer::per_key`](crate::BulkheadLayer::per_key).
///
/// See [`KeyedHandle`] for the bound on live compartments, idle eviction and
/// the fallback compartment.
///
/// # Clone
///
/// Clones share the registry of compartments (and clone the key function).
pub struct PerKey<F, Q> {
    key_fn: F,
    registry: Arc<Registry<Q>>,
}

/// The live compartments of a keyed bulkhead, bounded in number.
pub(crate) struct Registry<Q> {
    config: KeyedConfig,
    /// The handles every key's compartment records into: the layer's name,
    /// never the key, labels them.
    metrics: CompartmentMetrics,
    epoch: Instant,
    fallback: Arc<Compartment>,
    state: Mutex<RegistryState<Q>>,
}

#[derive(Debug, Clone)]
pub(crate) struct KeyedConfig {
    pub(crate) name: Name,
    pub(crate) limit: LimitSpec,
    pub(crate) max_keys: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) fallback_limit: LimitSpec,
}

struct RegistryState<Q> {
    map: HashMap<Q, Arc<Compartment>>,
    /// No sweep for idle compartments before this time (ms since epoch).
    next_sweep_ms: u64,
}

/// A read-only view of a keyed bulkhead: its live compartments, their
/// counters, and the fallback compartment.
///
/// # The bound
///
/// At most [`max_keys`](Self::max_keys) compartments live at once. A
/// compartment is *idle* when no call holds or waits for one of its slots
/// and no call has been routed to it for the idle timeout; idle
/// compartments are evicted (with their counters) by a sweep that runs on
/// the next request for an unknown key, at most once per eighth of the idle
/// timeout. A request whose key is new while the registry is full goes to
/// the **fallback compartment**, shared by all such requests, named
/// `name/fallback`, whose limit is the `fallback_limit` (by default the
/// per-key limit). Known keys keep their own compartments, so a flood of
/// made-up keys can fill the registry and then only compete for the
/// fallback, never grow memory or take slots from real keys.
///
/// # Clone
///
/// Clones look at the same registry.
pub struct KeyedHandle<Q> {
    registry: Arc<Registry<Q>>,
}

// === impl Single ===

impl Single {
    pub(crate) fn new(name: Name, spec: LimitSpec) -> Self {
        let metrics = CompartmentMetrics::new(&name);
        Self {
            compartment: Arc::new(Compartment::with_epoch(
                name,
                &spec,
                Instant::now(),
                metrics,
            )),
            spec,
        }
    }

    pub(crate) fn name(&self) -> Name {
        self.compartment.name().clone()
    }

    pub(crate) fn spec(&self) -> LimitSpec {
        self.spec.clone()
    }

    pub(crate) fn handle(&self) -> CompartmentHandle {
        CompartmentHandle::new(self.compartment.clone())
    }
}

impl fmt::Debug for Single {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Single").field(&self.compartment).finish()
    }
}

impl<Req> Partition<Req> for Single {}

impl<Req> sealed::Select<Req> for Single {
    #[inline]
    fn with_compartment<R>(&self, _req: &Req, f: impl FnOnce(&Arc<Compartment>) -> R) -> R {
        f(&self.compartment)
    }
}

// === impl PerKey ===

impl<F, Q> PerKey<F, Q>
where
    Q: Hash + Eq,
{
    pub(crate) fn new(key_fn: F, config: KeyedConfig) -> Self {
        Self {
            key_fn,
            registry: Arc::new(Registry::new(config)),
        }
    }

    pub(crate) fn reconfigure(self, change: impl FnOnce(&mut KeyedConfig)) -> Self {
        let mut config = self.registry.config.clone();
        change(&mut config);
        Self::new(self.key_fn, config)
    }

    pub(crate) fn handle(&self) -> KeyedHandle<Q> {
        KeyedHandle {
            registry: self.registry.clone(),
        }
    }
}

impl<F: Clone, Q> Clone for PerKey<F, Q> {
    fn clone(&self) -> Self {
        Self {
            key_fn: self.key_fn.clone(),
            registry: self.registry.clone(),
        }
    }
}

impl<F, Q> fmt::Debug for PerKey<F, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKey")
            .field("key_fn", &format_args!("{}", std::any::type_name::<F>()))
            .field("config", &self.registry.config)
            .finish()
    }
}

impl<Req, F, Q> Partition<Req> for PerKey<F, Q>
where
    F: Fn(&Req) -> Q,
    Q: Hash + Eq + fmt::Debug,
{
}

impl<Req, F, Q> sealed::Select<Req> for PerKey<F, Q>
where
    F: Fn(&Req) -> Q,
    Q: Hash + Eq + fmt::Debug,
{
    fn with_compartment<R>(&self, req: &Req, f: impl FnOnce(&Arc<Compartment>) -> R) -> R {
        let key = (self.key_fn)(req);
        f(&self.registry.compartment(key))
    }
}

// === impl Registry ===

impl<Q: Hash + Eq> Registry<Q> {
    fn new(config: KeyedConfig) -> Self {
        let epoch = Instant::now();
        let fallback_name: Name = format!("{}/fallback", config.name).into();
        let fallback = Arc::new(Compartment::with_epoch(
            fallback_name.clone(),
            &config.fallback_limit,
            epoch,
            CompartmentMetrics::new(&fallback_name),
        ));
        Self {
            metrics: CompartmentMetrics::new(&config.name),
            epoch,
            fallback,
            state: Mutex::new(RegistryState {
                map: HashMap::new(),
                next_sweep_ms: 0,
            }),
            config,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryState<Q>> {
        // The map stays consistent even if a holder panicked: every update
        // is a single insert or retain.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The compartment of `key`: its own if it has one or there is room
    /// for one, the fallback otherwise.
    fn compartment(&self, key: Q) -> Arc<Compartment>
    where
        Q: fmt::Debug,
    {
        let now_ms = millis_since(self.epoch, Instant::now());
        let mut state = self.lock();
        if let Some(compartment) = state.map.get(&key) {
            compartment.touch(now_ms);
            return compartment.clone();
        }
        if now_ms >= state.next_sweep_ms {
            let idle_ms = u64::try_from(self.config.idle_timeout.as_millis()).unwrap_or(u64::MAX);
            // Only the map holds an idle compartment: every permit and
            // every waiter holds a clone of its `Arc`. Clones are only made
            // under this lock, so the count cannot rise while we look.
            state.map.retain(|_, c| {
                Arc::strong_count(c) > 1 || now_ms.saturating_sub(c.last_used_ms()) < idle_ms
            });
            state.next_sweep_ms = now_ms.saturating_add((idle_ms / 8).max(1));
        }
        if state.map.len() >= self.config.max_keys {
            return self.fallback.clone();
        }
        let name: Name = format!("{}[{key:?}]", self.config.name).into();
        let compartment = Arc::new(Compartment::with_epoch(
            name,
            &self.config.limit,
            self.epoch,
            self.metrics.clone(),
        ));
        compartment.touch(now_ms);
        state.map.insert(key, compartment.clone());
        compartment
    }
}

impl<Q> fmt::Debug for Registry<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === impl KeyedHandle ===

impl<Q: Hash + Eq> KeyedHandle<Q> {
    /// The counters of `key`'s own compartment, or `None` if it has none
    /// right now (never used, evicted, or sent to the fallback).
    #[must_use]
    pub fn get(&self, key: &Q) -> Option<Stats> {
        self.registry.lock().map.get(key).map(|c| c.stats())
    }

    /// The fallback compartment, used by new keys while the registry is
    /// full. It lives as long as the bulkhead and is never evicted.
    #[must_use]
    pub fn fallback(&self) -> CompartmentHandle {
        CompartmentHandle::new(self.registry.fallback.clone())
    }

    /// How many keyed compartments are alive (the fallback not included).
    /// Never more than [`max_keys`](Self::max_keys).
    #[must_use]
    pub fn len(&self) -> usize {
        self.registry.lock().map.len()
    }

    /// Whether no keyed compartment is alive.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bound on live keyed compartments.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.registry.config.max_keys
    }

    /// Every live key with its counters, in no particular order. Holds the
    /// registry's lock while it copies, so keep it for metrics scrapes, not
    /// for every request.
    #[must_use]
    pub fn snapshot(&self) -> Vec<(Q, Stats)>
    where
        Q: Clone,
    {
        self.registry
            .lock()
            .map
            .iter()
            .map(|(k, c)| (k.clone(), c.stats()))
            .collect()
    }
}

impl<Q> Clone for KeyedHandle<Q> {
    fn clone(&self) -> Self {
        Self {
            registry: self.registry.clone(),
        }
    }
}

impl<Q> fmt::Debug for KeyedHandle<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedHandle")
            .field("registry", &self.registry)
            .finish()
    }
}

pub(crate) mod sealed {
    use std::sync::Arc;

    use crate::compartment::Compartment;

    /// The private half of [`Partition`](super::Partition).
    #[allow(unreachable_pub)]
    pub trait Select<Req> {
        /// Runs `f` with the compartment of `req`.
        fn with_compartment<R>(&self, req: &Req, f: impl FnOnce(&Arc<Compartment>) -> R) -> R;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compartment::Permit;

    fn registry(max_keys: usize) -> Registry<u32> {
        Registry::new(KeyedConfig {
            name: "r".into(),
            limit: LimitSpec::Fixed(2),
            max_keys,
            idle_timeout: Duration::from_secs(10),
            fallback_limit: LimitSpec::Fixed(1),
        })
    }

    #[test]
    fn keys_get_their_own_compartments_until_the_bound() {
        let r = registry(2);
        let a = r.compartment(1);
        assert!(Arc::ptr_eq(&a, &r.compartment(1)));
        let b = r.compartment(2);
        assert!(!Arc::ptr_eq(&a, &b));
        let c = r.compartment(3);
        assert!(Arc::ptr_eq(&c, &r.fallback));
        assert_eq!(&**c.name(), "r/fallback");
        assert_eq!(&**a.name(), "r[1]");
    }

    /// Each lookup of a key restarts its idle timeout: a key used 2 s ago
    /// survives the sweep that evicts a key unused for 11 s.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_lookup_restarts_the_idle_timeout() {
        let r = registry(2);
        drop((r.compartment(1), r.compartment(2)));
        tokio::time::advance(Duration::from_secs(9)).await;
        drop(r.compartment(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        // A new key triggers the sweep: 2 goes, 1 stays, 3 gets its own.
        let three = r.compartment(3);
        assert!(!Arc::ptr_eq(&three, &r.fallback));
        let map = &r.lock().map;
        assert!(map.contains_key(&1), "used 2 s ago, idle timeout 10 s");
        assert!(!map.contains_key(&2), "unused for 11 s");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn busy_compartments_are_never_evicted() {
        let r = registry(1);
        let busy = r.compartment(1);
        let _permit = Permit::try_acquire(&busy).unwrap();
        drop(busy);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(Arc::ptr_eq(&r.compartment(2), &r.fallback));
        assert_eq!(r.lock().map.len(), 1);
    }
}
