//! One breaker per key (host, route, tenant), from a key function, in a
//! bounded, sharded registry.
//!
//! The registry is a fixed array of shards, picked by the key's hash (one
//! SipHash with a per-registry random key, so made-up keys cannot be aimed
//! at one shard). Each shard is an `RwLock` over a table: a `Vec` of slots
//! (key, breaker, per-thread handles, last use) and an index from hash to
//! slot, with the rare equal hashes chained through the slots. The `Vec`
//! lets a clock hand walk the slots to find a breaker to evict without
//! scanning them all.

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::mem;
use std::sync::{Arc, OnceLock, PoisonError, TryLockError};
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::hook::AttemptHook;

use crate::breaker::{nanos, thread_index, Breaker, STRIPES};
use crate::classify::Classify;
use crate::config::BreakerConfig;
use crate::hook::BreakerHook;
use crate::sync::{
    AtomicU64, AtomicUsize, Ordering::Relaxed, RandomState, RwLock, RwLockReadGuard,
};
use crate::{Mode, State};

/// The default most keys in a [`BreakerRegistry`]: 1,024 (the same bound
/// as `tower_bulkhead::DEFAULT_MAX_KEYS`).
pub const DEFAULT_MAX_KEYS: usize = 1024;

/// The default time a closed breaker must go unused before a new key may
/// evict it: 10 minutes.
///
/// Longer than the 60 s of `tower_bulkhead::DEFAULT_IDLE_TIMEOUT` on
/// purpose: a breaker's window is evidence about an outage, a bulkhead's
/// counters are not. A key called once a minute needs its breaker to live
/// across the gaps to ever reach [`minimum_calls`](BreakerConfig::minimum_calls)
/// (10 calls by default, so 10 minutes); evicted after 60 s, it would
/// start from an empty window before every call and could never open. An
/// idle bulkhead compartment holds nothing in flight, and forgetting it
/// loses only statistics. Eviction only happens while the registry is full,
/// so the default costs memory only up to
/// [`max_keys`](BreakerRegistry::max_keys).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Shards of a registry (a power of two).
const SHARDS: usize = 16;
/// The most slots one new key examines, over every shard, when the
/// registry is full.
const SAMPLES: usize = 32;
/// Use is recorded at a granularity of this fraction of the idle timeout.
const GRAIN_DIVISOR: u64 = 64;
/// The least interval between two `circuit_registry_full` warnings.
const FULL_EVENT_INTERVAL: Duration = Duration::from_secs(1);
/// The end of a chain of slots with one hash.
const NONE: usize = usize::MAX;

/// A bounded map from keys to [`Breaker`]s, all built from one
/// configuration; the registry of the keyed layers ([`KeyedBreakerLayer`](crate::KeyedBreakerLayer)
/// and its flavours).
///
/// Each key gets its own breaker, named `"{prefix}:{key}"`, the first time
/// it is seen, so the key type must implement [`Display`](fmt::Display).
///
/// # The bound and eviction
///
/// At most [`max_keys`](Self::max_keys) breakers live at once (an exact,
/// registry-wide bound), so hostile input (random hosts or paths) cannot
/// grow memory. Nothing is evicted while there is room. When the registry
/// is full, a new key may evict a breaker that is closed, in
/// [`Mode::Automatic`], and unused for the
/// [`idle_timeout`](Self::idle_timeout) (default
/// [`DEFAULT_IDLE_TIMEOUT`], 10 minutes; see there why it is longer than
/// the bulkhead's). Open and half-open breakers, and breakers in a manual
/// mode, are never evicted, so an outage cannot be forgotten by flooding
/// the registry. If nothing can go, the key shares the registry's
/// *overflow* breaker (named `"{prefix}:overflow"`), which trips for all
/// such keys together, and a `circuit_registry_full` warning is emitted (at
/// most once a second).
///
/// A new key evicts at most one breaker, and finds it by sampling, not by
/// scanning: a clock hand per shard walks its slots, and each new key looks
/// at no more than 32 slots, going on from where the previous new key
/// stopped (one walk over every shard whose lock is free). So a breaker
/// that may go is found within `max_keys / 32 + 1` new keys (when no other
/// thread holds the shards' locks); until then a new key may get the
/// overflow breaker although some breaker could have gone. Once a hand has
/// been round every slot of its shard without a victim, the shard
/// remembers the earliest time any of its breakers could become evictable;
/// while the registry is full and that time has not come for any shard, a
/// new key goes to the overflow breaker at once, without taking a write
/// lock. So a flood of unique keys against a full registry costs each of
/// them about as much as a known key.
///
/// Use is recorded at a granularity of 1/64 of the idle timeout (about
/// 9 s by default), on the safe side: a breaker is never evicted before it
/// has been unused for the idle timeout, and may stay up to 1/64 of it
/// longer. A breaker that has only been created (a key seen once) is
/// evicted exactly on time.
///
/// # Cost per call
///
/// A known key costs its hash, one read lock of its shard, one clock read,
/// and the clone of a handle kept per thread stripe, so threads calling the
/// same key do not bounce a reference count; its last use is written at
/// most once per granularity step. Nothing is allocated beyond what the
/// key function allocates (prefer keys that are cheap to build, like
/// `&'static str` route names). Only new keys take a write lock, on one of
/// 16 shards, so unrelated keys rarely contend.
///
/// # Clone
///
/// Clones share the map (one `Arc`).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker::{BreakerConfig, BreakerRegistry, Mode, State};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = BreakerRegistry::new("hosts", BreakerConfig::new())
///     .max_keys(2)
///     .idle_timeout(Duration::from_secs(60));
/// let a = registry.get(&"a.example".to_owned());
/// assert_eq!(a.name(), "hosts:a.example");
/// a.set_mode(Mode::ForcedOpen);
/// let b = registry.get(&"b.example".to_owned());
/// assert_eq!(b.snapshot().state, State::Closed);
///
/// // Full, and nothing may be evicted yet: the overflow breaker.
/// assert_eq!(registry.get(&"c.example".to_owned()).name(), "hosts:overflow");
/// assert_eq!(registry.len(), 2);
///
/// // A minute later, b (closed, idle) makes room; a (forced open) stays.
/// tokio::time::advance(Duration::from_secs(60)).await;
/// assert_eq!(registry.get(&"c.example".to_owned()).name(), "hosts:c.example");
/// assert!(registry.find(&"a.example".to_owned()).is_some());
/// assert!(registry.find(&"b.example".to_owned()).is_none());
/// # }
/// ```
pub struct BreakerRegistry<K> {
    inner: Arc<Registry<K>>,
}

/// The registry's state, shared by its clones.
struct Registry<K> {
    prefix: Arc<str>,
    config: BreakerConfig,
    max_keys: usize,
    idle_ns: u64,
    /// The granularity of recorded use (see [`Entry::touch`]).
    grain_ns: u64,
    /// The zero of every time kept here (nanoseconds since).
    base: Instant,
    hasher: RandomState,
    shards: Box<[Shard<K>]>,
    /// Places taken (reserved just before each insertion, given back on
    /// eviction): never above `max_keys`.
    len: AtomicUsize,
    /// No breaker of any shard can be evicted before this time: the least
    /// of the shards' `evictable_at` (a lower bound; 0 = try now).
    evictable_at: AtomicU64,
    /// The shard where the search for a breaker to evict goes on.
    cursor: AtomicUsize,
    overflow: Entry,
    next_full_event_ns: AtomicU64,
}

/// One shard: its table, and when it is worth looking for a victim in it.
#[repr(align(128))]
struct Shard<K> {
    table: RwLock<Table<K>>,
    /// No breaker of this shard can be evicted before this time (a lower
    /// bound, published when the hand has been round every slot without a
    /// victim; 0 = try now).
    evictable_at: AtomicU64,
}

/// The keys of one shard and their breakers.
struct Table<K> {
    /// Hash -> the first slot with that hash (the others are chained
    /// through [`Slot::next`]).
    index: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
    slots: Vec<Slot<K>>,
    /// The next slot the clock hand examines.
    hand: usize,
    /// The hand's current round: slots left to examine before it has seen
    /// them all, and the earliest time any of those seen could be evicted.
    round_left: usize,
    round_earliest: u64,
}

struct Slot<K> {
    key: K,
    hash: u64,
    /// The next slot with the same hash, or [`NONE`].
    next: usize,
    entry: Entry,
}

/// One key's breaker, its handles and its last use.
struct Entry {
    breaker: Breaker,
    /// One handle per thread stripe, made on first use from that stripe: a
    /// call clones the `Arc` of its own thread's stripe, so calls on
    /// different threads touch different reference counts.
    handles: [OnceLock<Arc<Handle>>; STRIPES],
    /// A time no earlier than the last use (nanoseconds since the
    /// registry's base); see [`Entry::touch`].
    used_until: AtomicU64,
}

/// What a call needs of its key: the breaker, and the attempt hook of the
/// client flavour (made on first use).
pub(super) struct Handle {
    pub(super) breaker: Breaker,
    hook: OnceLock<OwnedHook>,
}

/// An attempt hook and the classifier it was made for.
struct OwnedHook {
    owner: HookOwner,
    hook: Arc<dyn AttemptHook>,
}

/// Identifies a classifier (and the response type it judges) for the
/// per-key hooks: its type and, unless it is zero-sized (so all its values
/// are alike), the id of the layer that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HookOwner {
    types: TypeId,
    layer: u64,
}

/// What the hand found in one shard.
enum Sweep<K> {
    /// One breaker evicted (its slot, to drop outside the lock).
    Evicted(Slot<K>),
    /// Round every slot without a victim: none can be evicted before this
    /// time.
    Exhausted(u64),
    /// Out of samples before the end of the round.
    Unfinished,
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct Prehashed(u64);

// === impl BreakerRegistry ===

impl<K> BreakerRegistry<K>
where
    K: Hash + Eq + Clone + fmt::Display,
{
    /// An empty registry whose breakers are named `"{prefix}:{key}"` and
    /// built from `config`, with at most [`DEFAULT_MAX_KEYS`] keys and
    /// [`DEFAULT_IDLE_TIMEOUT`].
    pub fn new(prefix: impl Into<Arc<str>>, config: BreakerConfig) -> Self {
        let prefix = prefix.into();
        let overflow = Breaker::with_config(format!("{prefix}:overflow"), config.clone());
        let idle_ns = nanos(DEFAULT_IDLE_TIMEOUT);
        Self {
            inner: Arc::new(Registry {
                prefix,
                config,
                max_keys: DEFAULT_MAX_KEYS,
                idle_ns,
                grain_ns: idle_ns / GRAIN_DIVISOR,
                base: Instant::now(),
                hasher: RandomState::new(),
                shards: (0..SHARDS).map(|_| Shard::new()).collect(),
                len: AtomicUsize::new(0),
                evictable_at: AtomicU64::new(0),
                cursor: AtomicUsize::new(0),
                overflow: Entry::new(overflow, 0),
                next_full_event_ns: AtomicU64::new(0),
            }),
        }
    }

    /// The most keys with a breaker of their own (default
    /// [`DEFAULT_MAX_KEYS`], 1,024); past it, new keys share the overflow
    /// breaker. Zero sends every key to the overflow breaker. Only takes
    /// effect on a registry that has not been cloned yet.
    #[must_use]
    pub fn max_keys(mut self, max: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.max_keys = max;
        }
        self
    }

    /// How long a closed breaker must have been unused before a new key may
    /// evict it while the registry is full (default
    /// [`DEFAULT_IDLE_TIMEOUT`], 10 minutes). Eviction forgets the
    /// breaker's window and totals. Only takes effect on a registry that
    /// has not been cloned yet.
    #[must_use]
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.idle_ns = nanos(idle);
            inner.grain_ns = inner.idle_ns / GRAIN_DIVISOR;
        }
        self
    }

    /// The breaker of `key`, created if needed, or the overflow breaker
    /// when the registry is full and nothing can be evicted. Counts as a
    /// use of `key`.
    pub fn get(&self, key: &K) -> Breaker {
        let r = &*self.inner;
        let hash = r.hasher.hash_one(key);
        let now = r.now_ns();
        let handle = match r.lookup(key, hash, now) {
            Some(handle) => handle,
            None => r.admit_new(key.clone(), hash, now),
        };
        handle.breaker.clone()
    }

    /// The breaker of `key`, if it has one (never the overflow breaker).
    /// Does not count as a use.
    #[must_use]
    pub fn find(&self, key: &K) -> Option<Breaker> {
        let r = &*self.inner;
        let hash = r.hasher.hash_one(key);
        let table = r.shard(hash).read();
        table.get(hash, key).map(|slot| slot.entry.breaker.clone())
    }

    /// How many keys have a breaker; never more than
    /// [`max_keys`](Self::max_keys).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.len.load(Relaxed)
    }

    /// Whether no key has a breaker yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key's breaker, in no particular order, for dashboards: one
    /// consistent picture, never more than [`max_keys`](Self::max_keys).
    /// Holds every shard's read lock while it copies (new keys wait), so
    /// keep it for metrics scrapes, not for every request.
    #[must_use]
    pub fn breakers(&self) -> Vec<(K, Breaker)> {
        // In shard order; a writer never waits for a second shard (it only
        // tries), so this cannot deadlock with one.
        let tables: Vec<_> = self.inner.shards.iter().map(Shard::read).collect();
        tables
            .iter()
            .flat_map(|table| table.slots.iter())
            .map(|slot| (slot.key.clone(), slot.entry.breaker.clone()))
            .collect()
    }
}

impl<K: Hash + Eq + fmt::Display> BreakerRegistry<K> {
    /// The handle of `key`: the known-key path, or the admission of a new
    /// key.
    #[inline]
    pub(super) fn handle(&self, key: K) -> Arc<Handle> {
        let r = &*self.inner;
        let hash = r.hasher.hash_one(&key);
        let now = r.now_ns();
        match r.lookup(&key, hash, now) {
            Some(handle) => handle,
            None => r.admit_new(key, hash, now),
        }
    }
}

impl<K> BreakerRegistry<K> {
    /// The breaker shared by keys that found the registry full.
    #[must_use]
    pub fn overflow(&self) -> &Breaker {
        &self.inner.overflow.breaker
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
        let r = &*self.inner;
        f.debug_struct("BreakerRegistry")
            .field("prefix", &r.prefix)
            .field("keys", &r.len.load(Relaxed))
            .field("max_keys", &r.max_keys)
            .field("idle_timeout", &Duration::from_nanos(r.idle_ns))
            .finish_non_exhaustive()
    }
}

// === impl Registry ===

impl<K> Registry<K> {
    fn now_ns(&self) -> u64 {
        nanos(crate::sync::since(self.base))
    }

    fn shard_index(hash: u64) -> usize {
        // Bits the shard's own map uses neither for its buckets (the low
        // ones) nor for its control bytes (the top seven).
        (hash >> 40) as usize % SHARDS
    }

    fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[Self::shard_index(hash)]
    }
}

impl<K> Registry<K>
where
    K: Hash + Eq + fmt::Display,
{
    /// The handle of a key that has a breaker, marking it used (the
    /// known-key path: one read lock, no shared write).
    #[inline]
    fn lookup(&self, key: &K, hash: u64, now: u64) -> Option<Arc<Handle>> {
        let table = self.shard(hash).read();
        let slot = table.get(hash, key)?;
        slot.entry.touch(now, self.grain_ns);
        Some(slot.entry.handle())
    }

    /// The handle of a key [`lookup`](Self::lookup) did not find: a new
    /// breaker if there is room or room can be made, else the overflow.
    ///
    /// The new breaker is built, and the evicted one dropped, outside every
    /// lock; only the insertion takes the write lock of the key's shard.
    /// Callers racing on one new key each take a place (evicting a breaker
    /// each, if the registry is full); all but the first give theirs back.
    fn admit_new(&self, key: K, hash: u64, now: u64) -> Arc<Handle> {
        // Full, and no shard can evict anything yet: no write lock at all.
        if self.len.load(Relaxed) >= self.max_keys && now < self.evictable_at.load(Relaxed) {
            return self.overflowed(now);
        }
        // A place of its own: a free one, or an evicted breaker's.
        if !self.reserve() {
            match self.make_room(now) {
                Some(evicted) => drop(evicted),
                None => return self.overflowed(now),
            }
        }
        let breaker = Breaker::with_config(format!("{}:{key}", self.prefix), self.config.clone());
        let entry = Entry::new(breaker, now);
        let mut table = self.shards[Self::shard_index(hash)]
            .table
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = table.get(hash, &key) {
            // Inserted by another caller since the lookup: give the place
            // back.
            self.len.fetch_sub(1, Relaxed);
            slot.entry.touch(now, self.grain_ns);
            return slot.entry.handle();
        }
        let handle = entry.handle();
        table.insert(key, hash, entry);
        handle
    }

    /// Takes a place for a new key, if there is one.
    fn reserve(&self) -> bool {
        self.len
            .fetch_update(Relaxed, Relaxed, |n| (n < self.max_keys).then_some(n + 1))
            .is_ok()
    }

    /// Evicts one breaker, whose place the new key takes over (`len` is
    /// unchanged), and returns it, to be dropped outside the lock. Examines
    /// at most [`SAMPLES`] slots, going on from where the last new key
    /// stopped (one walk over every shard whose lock is free, each with its
    /// own hand), and skips the shards that cannot evict anything yet.
    fn make_room(&self, now: u64) -> Option<Slot<K>> {
        let mut budget = SAMPLES;
        let first = self.cursor.load(Relaxed);
        for step in 0..SHARDS {
            let at = (first + step) % SHARDS;
            let shard = &self.shards[at];
            if !shard.may_evict(now) {
                continue;
            }
            let mut table = match shard.table.try_write() {
                Ok(table) => table,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            match table.evict_one(now, self.idle_ns, &mut budget) {
                Sweep::Evicted(slot) => {
                    self.cursor.store(at, Relaxed);
                    return Some(slot);
                }
                Sweep::Exhausted(when) => {
                    self.publish(at, when);
                    self.cursor.store((at + 1) % SHARDS, Relaxed);
                }
                Sweep::Unfinished => {
                    self.cursor.store(at, Relaxed);
                    break;
                }
            }
        }
        None
    }

    /// Records that shard `at` cannot evict anything before `when`, and
    /// recomputes the registry-wide bound. Each shard's bound only grows
    /// (but see [`Entry::evictable`]), so a stale read of another shard's
    /// makes the registry's bound lower than it could be, never higher.
    fn publish(&self, at: usize, when: u64) {
        self.shards[at].evictable_at.store(when, Relaxed);
        let least = self
            .shards
            .iter()
            .map(|shard| shard.evictable_at.load(Relaxed))
            .min()
            .unwrap_or(0);
        self.evictable_at.store(least, Relaxed);
    }

    /// The overflow breaker's handle, with the (rate-limited) warning.
    fn overflowed(&self, now: u64) -> Arc<Handle> {
        let due = self.next_full_event_ns.load(Relaxed);
        if now >= due
            && self
                .next_full_event_ns
                .compare_exchange(
                    due,
                    now.saturating_add(nanos(FULL_EVENT_INTERVAL)),
                    Relaxed,
                    Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                registry = %self.prefix,
                max_keys = self.max_keys,
                "circuit_registry_full"
            );
        }
        self.overflow.handle()
    }
}

// === impl Shard ===

impl<K> Shard<K> {
    fn new() -> Self {
        Self {
            table: RwLock::new(Table::new()),
            evictable_at: AtomicU64::new(0),
        }
    }

    #[inline]
    fn read(&self) -> RwLockReadGuard<'_, Table<K>> {
        // The table stays consistent if a holder panicked: user code (the
        // key's `Eq`, `Display`) runs before any change.
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn may_evict(&self, now: u64) -> bool {
        now >= self.evictable_at.load(Relaxed)
    }
}

// === impl Table ===

impl<K> Table<K> {
    fn new() -> Self {
        Self {
            index: HashMap::default(),
            slots: Vec::new(),
            hand: 0,
            round_left: 0,
            round_earliest: 0,
        }
    }

    /// The slot of `key`, whose hash is `hash`.
    #[inline]
    fn get(&self, hash: u64, key: &K) -> Option<&Slot<K>>
    where
        K: Eq,
    {
        let mut at = *self.index.get(&hash)?;
        loop {
            let slot = &self.slots[at];
            if slot.key == *key {
                return Some(slot);
            }
            if slot.next == NONE {
                return None;
            }
            at = slot.next;
        }
    }

    /// Adds a key that is not in the table.
    fn insert(&mut self, key: K, hash: u64, entry: Entry) {
        let at = self.slots.len();
        let next = self.index.insert(hash, at).unwrap_or(NONE);
        self.slots.push(Slot {
            key,
            hash,
            next,
            entry,
        });
    }

    /// Removes the slot at `at`; the last slot moves into its place.
    fn remove(&mut self, at: usize) -> Slot<K> {
        let (hash, next) = (self.slots[at].hash, self.slots[at].next);
        self.relink(hash, at, next);
        let last = self.slots.len() - 1;
        if at != last {
            let moved = self.slots[last].hash;
            self.relink(moved, last, at);
        }
        self.slots.swap_remove(at)
    }

    /// Makes whatever points at slot `from` in the chain of `hash` (the
    /// index or the previous slot) point at `to` instead.
    fn relink(&mut self, hash: u64, from: usize, to: usize) {
        let head = self
            .index
            .get_mut(&hash)
            .expect("every slot's hash is indexed");
        if *head == from {
            if to == NONE {
                self.index.remove(&hash);
            } else {
                *head = to;
            }
            return;
        }
        let mut at = *head;
        while self.slots[at].next != from {
            at = self.slots[at].next;
        }
        self.slots[at].next = to;
    }

    /// Moves the clock hand over at most `budget` slots (taking them from
    /// the budget) and evicts the first breaker that may go. At the end of
    /// a round without a victim, says when one could be found at the
    /// earliest.
    fn evict_one(&mut self, now: u64, idle_ns: u64, budget: &mut usize) -> Sweep<K> {
        if self.round_left == 0 {
            // A breaker added during the round cannot be evicted before
            // now + idle, so the round may miss it.
            self.round_left = self.slots.len();
            self.round_earliest = now.saturating_add(idle_ns);
        }
        while self.round_left > 0 && *budget > 0 {
            *budget -= 1;
            self.round_left -= 1;
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let at = self.hand;
            match self.slots[at].entry.evictable(now, idle_ns) {
                Ok(()) => {
                    // The last slot moves here: examine it next.
                    self.round_left = 0;
                    return Sweep::Evicted(self.remove(at));
                }
                Err(when) => {
                    self.round_earliest = self.round_earliest.min(when);
                    self.hand = at + 1;
                }
            }
        }
        if self.round_left == 0 {
            Sweep::Exhausted(self.round_earliest)
        } else {
            Sweep::Unfinished
        }
    }
}

// === impl Entry ===

impl Entry {
    fn new(breaker: Breaker, now: u64) -> Self {
        Self {
            breaker,
            handles: std::array::from_fn(|_| OnceLock::new()),
            used_until: AtomicU64::new(now),
        }
    }

    /// This thread's handle.
    #[inline]
    fn handle(&self) -> Arc<Handle> {
        let handle = self.handles[thread_index() % STRIPES].get_or_init(|| {
            Arc::new(Handle {
                breaker: self.breaker.clone(),
                hook: OnceLock::new(),
            })
        });
        Arc::clone(handle)
    }

    /// Records a use at `now`. `used_until` stays no earlier than every
    /// use: a use after it moves it to `now + grain`, so a key in steady
    /// use writes it once per `grain`, not on every call.
    #[inline]
    fn touch(&self, now: u64, grain: u64) {
        if now > self.used_until.load(Relaxed) {
            self.used_until
                .fetch_max(now.saturating_add(grain), Relaxed);
        }
    }

    /// Whether the breaker may be evicted now (closed, automatic, unused
    /// for `idle_ns`), or else the earliest time it could be.
    ///
    /// That time is exact for an idle period still running. For a breaker
    /// that is not closed or is in a manual mode, it is `now + idle`: such
    /// a breaker only closes through a call (which marks it used), except
    /// when its mode is switched by hand, and then it may wait up to one
    /// idle timeout longer to be evicted.
    fn evictable(&self, now: u64, idle_ns: u64) -> Result<(), u64> {
        let due = self.used_until.load(Relaxed).saturating_add(idle_ns);
        if now < due {
            return Err(due);
        }
        if self.breaker.mode() == Mode::Automatic && self.breaker.snapshot().state == State::Closed
        {
            Ok(())
        } else {
            Err(now.saturating_add(idle_ns))
        }
    }
}

// === impl Handle ===

impl Handle {
    /// The attempt hook for `classifier` judging `Res`: made on first use
    /// and kept for the classifier of `owner`; for another classifier (a
    /// second layer with its own classifier sharing the registry), a new
    /// one on every call.
    #[inline(always)]
    pub(super) fn hook<C, Res>(&self, owner: HookOwner, classifier: &C) -> HookRef<'_>
    where
        C: Classify<Res> + Clone,
        Res: 'static,
    {
        let make = || -> Arc<dyn AttemptHook> {
            Arc::new(BreakerHook::<C, Res>::new(
                self.breaker.clone(),
                classifier.clone(),
            ))
        };
        let kept = self.hook.get_or_init(|| OwnedHook {
            owner,
            hook: make(),
        });
        if kept.owner == owner {
            HookRef::Kept(&kept.hook)
        } else {
            HookRef::Made(make())
        }
    }
}

/// A hook kept in a handle, or made for one call.
pub(super) enum HookRef<'a> {
    Kept(&'a Arc<dyn AttemptHook>),
    Made(Arc<dyn AttemptHook>),
}

impl HookRef<'_> {
    pub(super) fn get(&self) -> &Arc<dyn AttemptHook> {
        match self {
            HookRef::Kept(hook) => hook,
            HookRef::Made(hook) => hook,
        }
    }
}

// === impl HookOwner ===

impl HookOwner {
    pub(super) fn of<C: 'static, Res: 'static>(layer: u64) -> Self {
        Self {
            types: TypeId::of::<(C, Res)>(),
            layer: if mem::size_of::<C>() == 0 { 0 } else { layer },
        }
    }
}

/// A fresh id for a layer's classifier.
pub(super) fn next_layer_id() -> u64 {
    // Std's even under the loom models (a static needs a `const` `new`).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

// === impl Prehashed ===

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry::new(Breaker::new("t"), 0)
    }

    /// A table whose keys all share a few hashes, so chains are long.
    fn table(keys: &[(u32, u64)]) -> Table<u32> {
        let mut t = Table::new();
        for &(key, hash) in keys {
            t.insert(key, hash, entry());
        }
        t
    }

    fn check(t: &Table<u32>, present: &[(u32, u64)], absent: &[(u32, u64)]) {
        for &(key, hash) in present {
            assert_eq!(t.get(hash, &key).map(|s| s.key), Some(key), "{key}");
        }
        for &(key, hash) in absent {
            assert!(t.get(hash, &key).is_none(), "{key}");
        }
        assert_eq!(t.slots.len(), present.len());
        let chained: usize = t
            .index
            .values()
            .map(|&head| {
                let (mut n, mut at) = (1, head);
                while t.slots[at].next != NONE {
                    at = t.slots[at].next;
                    n += 1;
                }
                n
            })
            .sum();
        assert_eq!(chained, present.len(), "every slot on exactly one chain");
    }

    #[test]
    fn removal_keeps_every_chain_whole_whatever_the_order() {
        // Keys 0..8 over hashes 0..3: chains of two or three slots, and the
        // moved last slot sometimes on the removed slot's own chain.
        let all: Vec<(u32, u64)> = (0..8).map(|k| (k, u64::from(k % 3))).collect();
        for first in 0..all.len() {
            let mut t = table(&all);
            let mut present = all.clone();
            let mut absent = Vec::new();
            let mut at = first;
            while !present.is_empty() {
                let pos = at % t.slots.len();
                let gone = t.remove(pos);
                let i = present.iter().position(|&(k, _)| k == gone.key).unwrap();
                absent.push(present.remove(i));
                check(&t, &present, &absent);
                at += 3;
            }
            assert!(t.index.is_empty());
        }
    }

    #[test]
    fn the_hand_reports_the_earliest_eviction_after_a_full_round() {
        let mut t = table(&[(1, 1), (2, 2), (3, 3)]);
        t.slots[1].entry.used_until.store(50, Relaxed);
        let mut budget = 2;
        assert!(matches!(
            t.evict_one(10, 100, &mut budget),
            Sweep::Unfinished
        ));
        let mut budget = 32;
        match t.evict_one(10, 100, &mut budget) {
            Sweep::Exhausted(at) => assert_eq!(at, 100, "slot 0 is due at 0 + 100"),
            _ => panic!("nothing is idle yet"),
        }
        assert_eq!(budget, 31, "one slot left in the round");
        let mut budget = 32;
        assert!(matches!(
            t.evict_one(100, 100, &mut budget),
            Sweep::Evicted(_)
        ));
        assert_eq!(t.slots.len(), 2);
    }

    #[test]
    fn an_empty_shard_cannot_evict_before_now_plus_idle() {
        let mut t = table(&[]);
        let mut budget = 32;
        assert!(matches!(
            t.evict_one(5, 100, &mut budget),
            Sweep::Exhausted(105)
        ));
    }

    /// A registry of `max` keys idle after `idle` seconds.
    fn registry(max: usize, idle: u64) -> BreakerRegistry<u32> {
        BreakerRegistry::new("r", BreakerConfig::new())
            .max_keys(max)
            .idle_timeout(Duration::from_secs(idle))
    }

    /// `n` keys whose breakers land in shard `shard` of `r`.
    fn keys_in(r: &BreakerRegistry<u32>, shard: usize, n: usize) -> Vec<u32> {
        // Bounded, so that a broken `shard_index` fails instead of hanging.
        let keys: Vec<u32> = (0..100_000)
            .filter(|k| Registry::<u32>::shard_index(r.inner.hasher.hash_one(k)) == shard)
            .take(n)
            .collect();
        assert_eq!(keys.len(), n, "keys of shard {shard}");
        keys
    }

    #[test]
    fn use_is_recorded_at_a_64th_of_the_idle_timeout() {
        assert_eq!(registry(1, 64).inner.grain_ns, 1_000_000_000);
        let default = BreakerRegistry::<u32>::new("r", BreakerConfig::new());
        assert_eq!(default.inner.grain_ns, 9_375_000_000, "600 s / 64");
    }

    #[test]
    fn a_registry_tells_whether_it_is_empty_and_what_it_holds() {
        let r = registry(4, 60);
        assert!(r.is_empty());
        r.get(&1);
        assert!(!r.is_empty());
        let text = format!("{r:?}");
        for part in [
            "BreakerRegistry",
            "prefix: \"r\"",
            "keys: 1",
            "max_keys: 4",
            "60s",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn the_shard_is_read_from_bits_40_to_43_of_the_hash() {
        assert_eq!(Registry::<u32>::shard_index(3 << 40), 3);
        assert_eq!(Registry::<u32>::shard_index((15 << 40) | 0xff), 15);
        assert_eq!(Registry::<u32>::shard_index((1 << 40) - 1), 0, "bits below");
        assert_eq!(Registry::<u32>::shard_index(0x1a << 40), 10, "bits above");
    }

    #[tokio::test(start_paused = true)]
    async fn the_search_for_a_victim_wraps_round_the_shards() {
        let r = registry(1, 60);
        let (a, b, c) = (
            keys_in(&r, 5, 1)[0],
            keys_in(&r, 3, 1)[0],
            keys_in(&r, 1, 1)[0],
        );
        assert_eq!(r.get(&a).name(), format!("r:{a}"));
        tokio::time::advance(Duration::from_secs(61)).await;
        // From shard 0 up to 5, where `a` is evicted: the search goes on
        // from there next time.
        assert_eq!(r.get(&b).name(), format!("r:{b}"));
        assert!(r.find(&a).is_none());
        assert_eq!(r.inner.cursor.load(Relaxed), 5);
        tokio::time::advance(Duration::from_secs(61)).await;
        // From shard 5 on, past 15 and back to 3, where `b` is.
        assert_eq!(r.get(&c).name(), format!("r:{c}"));
        assert!(r.find(&b).is_none());
        assert_eq!(r.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_without_a_victim_publishes_when_one_can_be_found() {
        let r = registry(1, 60);
        let a = keys_in(&r, 0, 1)[0];
        r.get(&a);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(r.get(&(a + 1)).name(), "r:overflow");
        let second = 1_000_000_000;
        // `a`, used at 0, may go at 60 s; the empty shards not before
        // 10 + 60 s.
        assert_eq!(r.inner.shards[0].evictable_at.load(Relaxed), 60 * second);
        assert_eq!(r.inner.shards[1].evictable_at.load(Relaxed), 70 * second);
        assert_eq!(r.inner.evictable_at.load(Relaxed), 60 * second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_without_a_victim_leaves_the_search_where_it_began() {
        let r = registry(1, 60);
        let a = keys_in(&r, 0, 1)[0];
        r.get(&a);
        // The last search stopped at shard 7; every shard moves the search
        // one on, so a round through all sixteen ends back at 7.
        r.inner.cursor.store(7, Relaxed);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(r.get(&(a + 1)).name(), "r:overflow");
        assert_eq!(r.inner.cursor.load(Relaxed), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_given_back_after_a_race_goes_to_the_next_new_key() {
        let r = registry(2, 60);
        let a = keys_in(&r, 4, 1)[0];
        r.get(&a);
        r.get(&(a + 1));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(r.get(&(a + 2)).name(), "r:overflow");
        assert!(r.inner.evictable_at.load(Relaxed) > r.inner.now_ns());
        // What two callers racing on one new key leave behind in a full
        // registry: each evicted a breaker, one inserted, the other gave
        // its place back.
        drop(r.inner.shards[4].table.write().unwrap().remove(0));
        r.inner.len.fetch_sub(1, Relaxed);
        assert_eq!(r.get(&(a + 2)).name(), format!("r:{}", a + 2));
        assert_eq!(r.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_search_skips_a_shard_that_cannot_evict_yet() {
        let r = registry(100, 60);
        let victim = keys_in(&r, 9, 1)[0];
        r.get(&victim);
        tokio::time::advance(Duration::from_secs(61)).await;
        // More fresh breakers in shard 2 than one search looks at.
        for key in keys_in(&r, 2, SAMPLES + 1) {
            r.get(&key);
        }
        let now = r.inner.now_ns();
        r.inner.shards[2]
            .evictable_at
            .store(now + 60 * 1_000_000_000, Relaxed);
        for shard in [0, 1] {
            r.inner.shards[shard].evictable_at.store(u64::MAX, Relaxed);
        }
        let evicted = r.inner.make_room(now).expect("shard 9's breaker");
        assert_eq!(evicted.key, victim);
    }

    #[tokio::test(start_paused = true)]
    async fn the_registry_full_warning_is_given_at_most_once_a_second() {
        let events = resilience_testkit::Events::at_least(tracing::Level::WARN);
        let _guard = resilience_testkit::set_default(events.clone());
        let r = registry(0, 60);
        r.get(&1);
        r.get(&2);
        assert_eq!(
            events.count("circuit_registry_full"),
            1,
            "the first at once"
        );
        tokio::time::advance(Duration::from_millis(999)).await;
        r.get(&3);
        assert_eq!(events.count("circuit_registry_full"), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        r.get(&4);
        assert_eq!(events.count("circuit_registry_full"), 2, "a second later");
    }

    #[test]
    fn a_handle_keeps_the_hook_of_its_first_classifier() {
        use tower_resilience_base::outcome::ErrorsOnly;
        let handle = Handle {
            breaker: Breaker::new("h"),
            hook: OnceLock::new(),
        };
        let mine = HookOwner::of::<ErrorsOnly, ()>(1);
        let other = HookOwner::of::<Arc<ErrorsOnly>, ()>(1);
        let first = Arc::clone(handle.hook::<_, ()>(mine, &ErrorsOnly).get());
        let again = Arc::clone(handle.hook::<_, ()>(mine, &ErrorsOnly).get());
        assert!(Arc::ptr_eq(&first, &again), "kept");
        let theirs = handle.hook::<_, ()>(other, &Arc::new(ErrorsOnly));
        assert!(matches!(theirs, HookRef::Made(_)));
        assert!(!Arc::ptr_eq(&first, theirs.get()), "made for the call");
    }

    #[test]
    fn a_zero_sized_classifier_is_the_same_owner_in_every_layer() {
        use tower_resilience_base::outcome::ErrorsOnly;
        let (one, two) = (next_layer_id(), next_layer_id());
        assert_ne!(one, two, "each layer its own id");
        assert_eq!(
            HookOwner::of::<ErrorsOnly, ()>(one),
            HookOwner::of::<ErrorsOnly, ()>(two)
        );
        assert_ne!(
            HookOwner::of::<Arc<ErrorsOnly>, ()>(one),
            HookOwner::of::<Arc<ErrorsOnly>, ()>(two)
        );
        assert_ne!(
            HookOwner::of::<ErrorsOnly, ()>(one),
            HookOwner::of::<ErrorsOnly, u8>(one),
            "another response type"
        );
    }

    #[test]
    fn a_prehashed_key_is_its_own_hash() {
        let build = BuildHasherDefault::<Prehashed>::default();
        assert_eq!(
            build.hash_one(0x1234_5678_9abc_def0_u64),
            0x1234_5678_9abc_def0
        );
        // Bytes are folded in, a rotation apart: the ninth meets the first.
        let mut h = Prehashed::default();
        h.write(&[0xff; 9]);
        assert_eq!(h.finish(), 0xffff_ffff_ffff_ff00);
    }

    #[test]
    fn use_is_recorded_once_per_grain_and_never_late() {
        let e = entry();
        e.touch(0, 10);
        assert_eq!(e.used_until.load(Relaxed), 0, "created at 0: exact");
        e.touch(3, 10);
        assert_eq!(e.used_until.load(Relaxed), 13);
        e.touch(13, 10);
        assert_eq!(e.used_until.load(Relaxed), 13, "no write within the grain");
        e.touch(14, 10);
        assert_eq!(e.used_until.load(Relaxed), 24);
    }
}
