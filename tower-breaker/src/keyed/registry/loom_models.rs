//! Loom models of the keyed registry: callers racing to get one new key,
//! another key of the same shard, and keys that must evict to get in.
//! Under the models the shards' locks are loom's, the registry's counters
//! loom's atomics, its clock the model's and its hasher seeded the same in
//! every execution (`crate::sync`), so a key falls in the same shard each
//! time. Run with `scripts/loom`.
//!
//! The per-thread handles (`OnceLock`s) are std's: loom runs every thread
//! of a model on one OS thread, and their initialisation makes no access
//! loom sees, so it runs whole between two of loom's steps.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::*;
use crate::sync::clock;

const IDLE: Duration = Duration::from_secs(1);

/// A registry of breakers with a count window of two, at most `max_keys`
/// breakers, evicting breakers unused for [`IDLE`]; the clock at zero.
fn registry(max_keys: usize) -> BreakerRegistry<String> {
    clock::set(Duration::ZERO);
    BreakerRegistry::new("loom", BreakerConfig::new().count_window(2))
        .max_keys(max_keys)
        .idle_timeout(IDLE)
}

/// The shard of `key` in `r`.
fn shard_of(r: &BreakerRegistry<String>, key: &str) -> usize {
    Registry::<String>::shard_index(r.inner.hasher.hash_one(key.to_owned()))
}

/// The first key `{prefix}{n}` that falls in `shard`.
fn key_in(r: &BreakerRegistry<String>, prefix: &str, shard: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .find(|key| shard_of(r, key) == shard)
        .expect("every shard is hit")
}

/// The breakers the shards hold.
fn slots(r: &BreakerRegistry<String>) -> usize {
    r.breakers().len()
}

/// Two threads get one new key while the main thread gets another new key
/// of the same shard (the same write lock, the same index). Both callers
/// of the first key get one breaker (the same state, not two look-alikes),
/// the registry holds exactly the two keys, and the place the losing
/// inserter took was given back: the count of places equals the breakers
/// held.
#[test]
fn racing_callers_of_one_new_key_share_one_breaker() {
    model(|| {
        let r = registry(4);
        let a = key_in(&r, "a", 0);
        let b = key_in(&r, "b", 0);
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (r, a) = (r.clone(), a.clone());
                thread::spawn(move || r.get(&a))
            })
            .collect();
        let other = r.get(&b);
        assert_eq!(other.name(), format!("loom:{b}"));
        let got: Vec<Breaker> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(
            Arc::ptr_eq(&got[0].core, &got[1].core),
            "two breakers for {a}"
        );
        let found = r.find(&a).expect("a is registered");
        assert!(Arc::ptr_eq(&found.core, &got[0].core));
        assert!(!Arc::ptr_eq(&found.core, &other.core));
        assert_eq!(r.len(), 2);
        assert_eq!(slots(&r), 2, "a place taken and never given back");
    });
}

/// A registry of two keys holding one, whose breaker has been idle for
/// [`IDLE`]; two new keys of two other shards race in. One takes the free
/// place, the other evicts the idle breaker for its own (a place is taken
/// by one caller only, so they never both count on the free one): both get
/// a breaker of their own, the idle one is gone, and the count of places
/// equals the breakers held, never above the bound.
#[test]
fn racing_new_keys_take_the_free_place_and_evict_the_idle_breaker() {
    model(|| {
        let r = registry(2);
        let old = key_in(&r, "old", 0);
        r.get(&old);
        clock::set(IDLE);
        let callers: Vec<_> = [("b", 1), ("c", 2)]
            .into_iter()
            .map(|(prefix, shard)| {
                let r = r.clone();
                let key = key_in(&r, prefix, shard);
                thread::spawn(move || {
                    assert_eq!(r.get(&key).name(), format!("loom:{key}"), "overflowed");
                    key
                })
            })
            .collect();
        let keys: Vec<String> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(r.find(&old).is_none(), "the idle breaker stayed");
        assert!(keys.iter().all(|key| r.find(key).is_some()));
        assert_eq!(r.len(), 2);
        assert_eq!(slots(&r), 2, "more breakers than places");
    });
}
