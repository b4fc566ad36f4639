//! The atomics of the fallback counters: std's, or, under
//! `--cfg tower_resilience_loom` only, those of
//! `tower_resilience_base::loom_sync`, so that the loom models
//! (`scripts/loom`) check the counters as they are written.

#[cfg(not(tower_resilience_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(tower_resilience_loom)]
pub(crate) use tower_resilience_base::loom_sync::{AtomicU64, AtomicUsize, Ordering};
