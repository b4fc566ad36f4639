//! What the lock-free cores (the windows, the state word and the probe
//! slots), the keyed registry and the fleet link synchronise and tell time
//! with: std's atomics and locks and tokio's clock, or, under
//! `--cfg tower_resilience_loom` only, the atomics of
//! `tower_resilience_base::loom_sync`, loom's locks and a clock the loom
//! models set (loom needs every execution to be the same given its
//! schedule, so time may not pass by itself, nor may a registry's keys
//! fall in other shards). See `scripts/loom`.

use std::time::Duration;

use tokio::time::Instant;

#[cfg(not(tower_resilience_loom))]
pub(crate) use std::collections::hash_map::RandomState;
#[cfg(not(tower_resilience_loom))]
pub(crate) use std::hint::spin_loop;
#[cfg(not(tower_resilience_loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(tower_resilience_loom))]
pub(crate) use std::sync::{Mutex, RwLock, RwLockReadGuard};

#[cfg(tower_resilience_loom)]
pub(crate) use loom::hint::spin_loop;
/// Loom's own (`loom_sync` has no `AtomicBool`): the fleet link uses its
/// flag with relaxed accesses only, which loom models exactly.
#[cfg(tower_resilience_loom)]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(tower_resilience_loom)]
pub(crate) use loom::sync::{Mutex, RwLock, RwLockReadGuard};
#[cfg(tower_resilience_loom)]
pub(crate) use tower_resilience_base::loom_sync::{
    fence, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// The keyed registry's hasher under the models: SipHash with fixed keys,
/// so a key falls in the same shard in every execution (std's
/// `RandomState` draws new keys for each registry).
#[cfg(tower_resilience_loom)]
pub(crate) type RandomState =
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The time since `base`.
#[cfg(not(tower_resilience_loom))]
#[inline]
pub(crate) fn since(base: Instant) -> Duration {
    Instant::now().saturating_duration_since(base)
}

/// The time since `base` at the moment of the call being made: the clock
/// reading a layer above already made for this call
/// ([`CallContext::now`](tower_resilience_base::CallContext::now), at most
/// the duration of the synchronous `call`s in between old), else the
/// clock's. Saves a clock read (tens of nanoseconds on a virtual machine)
/// on the paths that need the time per call, such as a rejection while
/// open.
#[cfg(not(tower_resilience_loom))]
#[inline]
pub(crate) fn call_since(base: Instant) -> Duration {
    tower_resilience_base::CallContext::current(|cx| cx.now())
        .map_or_else(|| since(base), |now| now.saturating_duration_since(base))
}

/// The time since `base`: the model's clock, whatever `base` (the models
/// have no call context).
#[cfg(tower_resilience_loom)]
pub(crate) fn call_since(base: Instant) -> Duration {
    since(base)
}

/// The time since `base`: the model's clock, whatever `base`.
#[cfg(tower_resilience_loom)]
pub(crate) fn since(_base: Instant) -> Duration {
    clock::now()
}

/// The loom models' clock: it stands still until a model moves it.
#[cfg(tower_resilience_loom)]
pub(crate) mod clock {
    use std::cell::Cell;
    use std::time::Duration;

    // Loom runs a model's threads as coroutines of one OS thread, so they
    // all see this one cell; each test of the harness has its own.
    thread_local! {
        static NOW: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// The time since every breaker's base, as the model set it.
    pub(crate) fn now() -> Duration {
        NOW.with(Cell::get)
    }

    /// Sets the time since every breaker's base.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn set(now: Duration) {
        NOW.with(|cell| cell.set(now));
    }
}
