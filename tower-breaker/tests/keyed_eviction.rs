//! The keyed registry's bound and eviction rules: only closed, automatic
//! breakers unused for the idle timeout go, one per new key, never early;
//! everything else stays, and new keys past the bound share the overflow
//! breaker.

mod support;

use support::*;
use tower_breaker::{BreakerRegistry, Mode, Outcome, State};

fn registry(max_keys: usize, idle_secs: u64) -> BreakerRegistry<String> {
    BreakerRegistry::new("hosts", config())
        .max_keys(max_keys)
        .idle_timeout(secs(idle_secs))
}

fn name(registry: &BreakerRegistry<String>, key: &str) -> String {
    registry.get(&key.to_owned()).name().to_owned()
}

fn has(registry: &BreakerRegistry<String>, key: &str) -> bool {
    registry.find(&key.to_owned()).is_some()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_only_created_is_evicted_exactly_at_the_idle_timeout() {
    let registry = registry(1, 60);
    assert_eq!(name(&registry, "a"), "hosts:a");
    advance(secs(60) - ms(1)).await;
    assert_eq!(name(&registry, "b"), "hosts:overflow", "t-1: still in use");
    assert!(has(&registry, "a"));
    advance(ms(2)).await;
    assert_eq!(name(&registry, "b"), "hosts:b", "t+1: a is evicted");
    assert!(!has(&registry, "a"));
    assert_eq!(registry.len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_used_breaker_stays_for_the_idle_timeout_after_its_last_use() {
    // Idle 64 s: use is recorded at a granularity of 1 s (1/64), on the
    // late side.
    let registry = registry(1, 64);
    registry.get(&"a".to_owned());
    advance(secs(10)).await;
    registry.get(&"a".to_owned()); // last use: t = 10 s
    advance(secs(64) - ms(1)).await;
    assert_eq!(
        name(&registry, "b"),
        "hosts:overflow",
        "t-1 after the last use"
    );
    advance(secs(1) + ms(1)).await;
    assert_eq!(
        name(&registry, "b"),
        "hosts:b",
        "gone one granularity step later"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn find_is_not_a_use() {
    let registry = registry(1, 60);
    registry.get(&"a".to_owned());
    advance(secs(30)).await;
    assert!(has(&registry, "a"));
    advance(secs(30)).await;
    assert_eq!(name(&registry, "b"), "hosts:b");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_new_key_evicts_one_idle_breaker_not_all() {
    let registry = registry(3, 60);
    for key in ["h0", "h1", "h2"] {
        registry.get(&key.to_owned());
    }
    registry.get(&"h0".to_owned()).set_mode(Mode::ForcedOpen);
    assert_eq!(
        name(&registry, "h3"),
        "hosts:overflow",
        "full, nothing idle"
    );
    advance(secs(60)).await;

    assert_eq!(name(&registry, "h3"), "hosts:h3");
    assert_eq!(registry.len(), 3, "one breaker made room");
    assert_eq!(has(&registry, "h1") as u8 + has(&registry, "h2") as u8, 1);
    assert_eq!(name(&registry, "h4"), "hosts:h4");
    assert!(!has(&registry, "h1") && !has(&registry, "h2"));
    assert!(has(&registry, "h0"), "forced open: kept");
    assert_eq!(
        name(&registry, "h5"),
        "hosts:overflow",
        "h3 and h4 are fresh"
    );
    assert_eq!(registry.len(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn open_half_open_and_manual_breakers_are_never_evicted() {
    let registry = BreakerRegistry::new("hosts", config().count_window(1).minimum_calls(1))
        .max_keys(6)
        .idle_timeout(secs(60));
    let open = registry.get(&"open".to_owned());
    record(&open, Outcome::Failure, 1);
    let half_open = registry.get(&"half-open".to_owned());
    record(&half_open, Outcome::Failure, 1);
    for (key, mode) in [
        ("forced-open", Mode::ForcedOpen),
        ("forced-closed", Mode::ForcedClosed),
        ("disabled", Mode::Disabled),
        ("metrics-only", Mode::MetricsOnly),
    ] {
        registry.get(&key.to_owned()).set_mode(mode);
    }
    advance(secs(5)).await;
    let probe = half_open.try_acquire().expect("the open period is over");
    assert_eq!(state(&half_open), State::HalfOpen);

    advance(secs(3600)).await;
    for i in 0..1000 {
        assert_eq!(name(&registry, &format!("new{i}")), "hosts:overflow");
    }
    for key in [
        "open",
        "half-open",
        "forced-open",
        "forced-closed",
        "disabled",
        "metrics-only",
    ] {
        assert!(has(&registry, key), "{key} was evicted");
    }
    assert_eq!(state(&open), State::Open);
    drop(probe);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_switched_back_to_automatic_is_evicted_within_one_idle_timeout() {
    let registry = registry(1, 60);
    let a = registry.get(&"a".to_owned());
    a.set_mode(Mode::ForcedOpen);
    advance(secs(120)).await;
    assert_eq!(name(&registry, "b"), "hosts:overflow");
    // Closed and idle for two minutes, but the registry has just seen it
    // forced open: it may wait up to one more idle timeout.
    a.set_mode(Mode::Automatic);
    advance(secs(60)).await;
    assert_eq!(name(&registry, "b"), "hosts:b");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_idle_breaker_makes_room_wherever_it_lives() {
    // 100 keys spread over the shards: once they are idle, new keys evict
    // them all, whichever shards the new keys fall in. A new key samples at
    // most 32 slots, so a few may get the overflow breaker while the hands
    // walk past fresh breakers: at most one per 32 slots walked (the 100
    // idle ones and the 100 that replace them).
    let registry = registry(100, 60);
    for i in 0..100 {
        registry.get(&format!("old{i}"));
    }
    for i in 0..1000 {
        assert_eq!(name(&registry, &format!("flood{i}")), "hosts:overflow");
    }
    advance(secs(60)).await;
    let (mut own, mut overflowed) = (0, 0);
    while own < 100 {
        let key = format!("new{}", own + overflowed);
        if name(&registry, &key) == format!("hosts:{key}") {
            own += 1;
        } else {
            overflowed += 1;
        }
        assert!(
            overflowed <= 200 / 32 + 1,
            "{overflowed} new keys overflowed"
        );
    }
    assert_eq!(registry.len(), 100);
    assert!((0..100).all(|i| !has(&registry, &format!("old{i}"))));
    assert_eq!(name(&registry, "one-too-many"), "hosts:overflow");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_idle_breaker_among_fresh_ones_is_found_within_max_keys_over_32_new_keys() {
    let registry = registry(256, 64);
    for i in 0..256 {
        registry.get(&format!("k{i}"));
    }
    advance(secs(30)).await;
    for i in 1..256 {
        registry.get(&format!("k{i}")); // all but k0 in use
    }
    advance(secs(34)).await;
    let found = (0..256 / 32 + 1).any(|i| {
        let key = format!("new{i}");
        name(&registry, &key) == format!("hosts:{key}")
    });
    assert!(found, "k0 was not found");
    assert!(!has(&registry, "k0"));
    assert_eq!(registry.len(), 256);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn zero_max_keys_sends_every_key_to_the_overflow_breaker() {
    let registry = registry(0, 60);
    assert_eq!(name(&registry, "a"), "hosts:overflow");
    advance(secs(3600)).await;
    assert_eq!(name(&registry, "a"), "hosts:overflow");
    assert!(registry.is_empty());
    assert_eq!(registry.overflow().name(), "hosts:overflow");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn below_the_bound_nothing_is_evicted() {
    let registry = registry(10, 1);
    for i in 0..5 {
        registry.get(&format!("k{i}"));
    }
    advance(secs(3600)).await;
    for i in 5..10 {
        registry.get(&format!("k{i}"));
    }
    assert_eq!(registry.len(), 10);
    assert!((0..10).all(|i| has(&registry, &format!("k{i}"))));
}
