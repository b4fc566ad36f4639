//! The last-good cache: the last good response per key, bounded in
//! entries, refused beyond a maximum staleness.
//!
//! A CLOCK ring (second-chance eviction, an approximation of LRU that needs
//! no list): a full cache evicts the first entry the hand finds that was
//! not used since the hand last passed it, or that is too stale to serve
//! anyway. Reads and writes take one short lock; the response is cloned
//! outside it when stored.

use std::collections::HashMap;
use std::hash::Hash;
use std::mem;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// What the cache holds for a key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recall<Res> {
    /// A response this old, within the maximum staleness.
    Fresh(Res, Duration),
    /// A response older than the maximum staleness: refused.
    TooStale(Duration),
    /// Nothing.
    Missing,
}

/// The cache, seen without its key's bounds (so that a fallback chain can
/// hold it without `Hash + Eq` on every key type).
pub(crate) trait Remember<K, Res>: Send + Sync {
    /// The response stored for `key`, if fresh enough at `now`.
    fn recall(&self, key: &K, now: Instant) -> Recall<Res>;
    /// Stores a clone of `response` for `key`, at `now`.
    fn remember(&self, key: K, response: &Res, now: Instant);
    /// The entries held.
    fn len(&self) -> usize;
}

/// The last good response per key.
pub(crate) struct LastGood<K, Res> {
    capacity: usize,
    max_staleness: Duration,
    ring: Mutex<Ring<K, Res>>,
}

struct Ring<K, Res> {
    index: HashMap<K, usize>,
    slots: Vec<Slot<K, Res>>,
    hand: usize,
}

struct Slot<K, Res> {
    key: K,
    response: Res,
    stored: Instant,
    referenced: bool,
}

// === impl LastGood ===

impl<K, Res> LastGood<K, Res> {
    pub(crate) fn new(capacity: usize, max_staleness: Duration) -> Self {
        Self {
            capacity,
            max_staleness,
            ring: Mutex::new(Ring {
                index: HashMap::new(),
                slots: Vec::new(),
                hand: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring<K, Res>> {
        // Nothing inside the lock leaves the ring half-updated, so a panic
        // elsewhere (in a `Hash` impl, say) does not make it unusable.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K, Res> Remember<K, Res> for LastGood<K, Res>
where
    K: Hash + Eq + Clone + Send + Sync,
    Res: Clone + Send,
{
    fn recall(&self, key: &K, now: Instant) -> Recall<Res> {
        let mut ring = self.lock();
        let Some(&i) = ring.index.get(key) else {
            return Recall::Missing;
        };
        let slot = &mut ring.slots[i];
        let age = now.saturating_duration_since(slot.stored);
        if age > self.max_staleness {
            return Recall::TooStale(age);
        }
        slot.referenced = true;
        Recall::Fresh(slot.response.clone(), age)
    }

    fn remember(&self, key: K, response: &Res, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        let response = response.clone();
        let mut ring = self.lock();
        let old = if let Some(&i) = ring.index.get(&key) {
            // from: an older answer for this key -> to: this one, used.
            let slot = &mut ring.slots[i];
            slot.stored = now;
            slot.referenced = true;
            mem::replace(&mut slot.response, response)
        } else if ring.slots.len() < self.capacity {
            let i = ring.slots.len();
            ring.index.insert(key.clone(), i);
            ring.slots.push(Slot {
                key,
                response,
                stored: now,
                referenced: false,
            });
            return;
        } else {
            let i = ring.victim(now, self.max_staleness);
            let slot = mem::replace(
                &mut ring.slots[i],
                Slot {
                    key: key.clone(),
                    response,
                    stored: now,
                    referenced: false,
                },
            );
            ring.index.remove(&slot.key);
            ring.index.insert(key, i);
            slot.response
        };
        drop(ring);
        // The old response (maybe a large body) is freed outside the lock.
        drop(old);
    }

    fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

// === impl Ring ===

impl<K, Res> Ring<K, Res> {
    /// The slot to evict from a full ring: the first, from the hand, that
    /// is too stale or was not used since the hand last passed (whose
    /// mark the hand clears as it passes). At most two turns.
    fn victim(&mut self, now: Instant, max_staleness: Duration) -> usize {
        let len = self.slots.len();
        loop {
            let i = self.hand;
            self.hand = (i + 1) % len;
            let slot = &mut self.slots[i];
            let stale = now.saturating_duration_since(slot.stored) > max_staleness;
            if stale || !slot.referenced {
                return i;
            }
            slot.referenced = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(60);

    fn fresh<Res>(r: Recall<Res>) -> Option<Res> {
        match r {
            Recall::Fresh(res, _) => Some(res),
            _ => None,
        }
    }

    #[test]
    fn serves_within_staleness_and_refuses_beyond() {
        let t0 = Instant::now();
        let cache = LastGood::new(4, MAX);
        cache.remember("a", &1, t0);
        assert_eq!(cache.recall(&"a", t0 + MAX), Recall::Fresh(1, MAX));
        let late = MAX + Duration::from_millis(1);
        assert_eq!(cache.recall(&"a", t0 + late), Recall::TooStale(late));
        assert_eq!(cache.recall(&"b", t0), Recall::Missing);
        // A newer answer restarts the age.
        cache.remember("a", &2, t0 + late);
        assert_eq!(
            cache.recall(&"a", t0 + late),
            Recall::Fresh(2, Duration::ZERO)
        );
    }

    #[test]
    fn holds_at_most_capacity_and_keeps_used_entries() {
        let t0 = Instant::now();
        let cache = LastGood::new(2, MAX);
        cache.remember(1, &"one", t0);
        cache.remember(2, &"two", t0);
        assert_eq!(fresh(cache.recall(&1, t0)), Some("one")); // used
        cache.remember(3, &"three", t0);
        assert_eq!(cache.len(), 2);
        assert_eq!(fresh(cache.recall(&1, t0)), Some("one"));
        assert_eq!(cache.recall(&2, t0), Recall::Missing);
        assert_eq!(fresh(cache.recall(&3, t0)), Some("three"));
        for k in 4..100 {
            cache.remember(k, &"more", t0);
            assert_eq!(cache.len(), 2);
        }
    }

    #[test]
    fn evicts_stale_entries_first() {
        let t0 = Instant::now();
        let cache = LastGood::new(2, MAX);
        cache.remember(1, &"old", t0);
        cache.remember(2, &"new", t0 + MAX);
        let _ = cache.recall(&1, t0); // used, but stale by the next write
        let _ = cache.recall(&2, t0 + MAX);
        cache.remember(3, &"newer", t0 + MAX + Duration::from_secs(1));
        assert_eq!(cache.recall(&1, t0), Recall::Missing);
        assert!(fresh(cache.recall(&2, t0 + MAX)).is_some());
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let cache = LastGood::new(0, MAX);
        cache.remember(1, &1, Instant::now());
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.recall(&1, Instant::now()), Recall::Missing);
    }
}
