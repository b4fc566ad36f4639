//! The atomics of the retry budget's buckets and of the hedging layer's
//! latency estimate: std's, or, under `--cfg tower_resilience_loom` only,
//! those of `tower_resilience_base::loom_sync`, so that the loom models
//! (`scripts/loom`) check them as they are written.

#[cfg(not(tower_resilience_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(tower_resilience_loom)]
pub(crate) use tower_resilience_base::loom_sync::{AtomicU32, AtomicU64, Ordering};

/// `N` counters at zero, built in place.
#[cfg(not(tower_resilience_loom))]
#[inline]
pub(crate) const fn zeroed<const N: usize>() -> [AtomicU64; N] {
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicU64 = AtomicU64::new(0);
    [ZERO; N]
}

/// `N` counters at zero (loom's atomics have no `const` constructor).
#[cfg(tower_resilience_loom)]
pub(crate) fn zeroed<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}
