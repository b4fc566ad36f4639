//! The atomics our crates' loom models run on, and the way they run them.
//!
//! Built only under `--cfg tower_resilience_loom` (see `scripts/loom`);
//! never part of a normal build or of the public API. Each crate's private
//! `sync` module re-exports std's atomics normally and these under that
//! cfg, so the lock-free cores are model-checked as they are written.
//!
//! # Why wrappers, not loom's atomics as they are
//!
//! Loom regards a `SeqCst` access (load, store, read-modify-write) as
//! `AcqRel`, which is weaker: it then reports executions that `SeqCst`
//! forbids (its README says so), such as both sides of a
//! "claim here, then look there" pattern missing each other. It does model
//! `fence(SeqCst)` exactly. So each wrapper puts a `SeqCst` fence before
//! and after every access made with `SeqCst`, which gives the accesses the
//! total order the code relies on; accesses with any weaker ordering reach
//! loom unchanged and fence-free, so weakening an ordering in the code
//! still shows in the models.

use loom::sync::atomic as inner;
pub use loom::sync::atomic::{fence, Ordering};
use Ordering::SeqCst;

/// The preemptions per execution the models explore unless
/// `LOOM_MAX_PREEMPTIONS` sets another bound. On two cores every model of
/// the workspace then runs in about 24 s (with 4: about 95 s, most of it
/// the three callers racing for a probe slot).
pub const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom's model checker: every interleaving of the loom
/// threads it spawns, within [`DEFAULT_PREEMPTIONS`] preemptions (or
/// `LOOM_MAX_PREEMPTIONS`), each with every value a load may return. Then
/// prints how many executions that was, under the test's name (seen with
/// `--nocapture`).
///
/// # Panics
///
/// Panics, with the failing interleaving, if `f` panics in any of them,
/// deadlocks, or leaves a loom thread running.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    model_with_branches(0, f);
}

/// As [`model`], with at least `max_branches` branches an execution may
/// take (loom's default is 1,000): for a model whose threads read many
/// atomics each, such as a histogram's buckets.
pub fn model_with_branches<F>(max_branches: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    builder.max_branches = builder.max_branches.max(max_branches);
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = executions.clone();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom: {}: {} executions (preemption bound {})",
        std::thread::current().name().unwrap_or("model"),
        executions.load(std::sync::atomic::Ordering::Relaxed),
        builder.preemption_bound.unwrap_or(DEFAULT_PREEMPTIONS),
    );
}

/// Runs `op`, between two `SeqCst` fences if `sc` (see the module docs).
#[inline]
#[track_caller]
fn ordered<R>(sc: bool, op: impl FnOnce() -> R) -> R {
    if sc {
        fence(SeqCst);
    }
    let r = op();
    if sc {
        fence(SeqCst);
    }
    r
}

macro_rules! atomic {
    ($(#[$doc:meta])* $name:ident, $int:ty) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        pub struct $name(inner::$name);

        impl $name {
            /// A new atomic holding `v`.
            #[track_caller]
            pub fn new(v: $int) -> Self {
                Self(inner::$name::new(v))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn load(&self, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.load(order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn store(&self, v: $int, order: Ordering) {
                ordered(order == SeqCst, || self.0.store(v, order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn swap(&self, v: $int, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.swap(v, order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn fetch_add(&self, v: $int, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.fetch_add(v, order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn fetch_sub(&self, v: $int, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.fetch_sub(v, order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn fetch_max(&self, v: $int, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.fetch_max(v, order))
            }

            /// As the std method of the same name.
            #[track_caller]
            pub fn fetch_min(&self, v: $int, order: Ordering) -> $int {
                ordered(order == SeqCst, || self.0.fetch_min(v, order))
            }

            /// As the std method of the same name.
            ///
            /// # Errors
            ///
            /// The value found, if it was not `current`.
            #[track_caller]
            pub fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                ordered(success == SeqCst || failure == SeqCst, || {
                    self.0.compare_exchange(current, new, success, failure)
                })
            }

            /// As the std method of the same name (loom's never fails
            /// spuriously).
            ///
            /// # Errors
            ///
            /// The value found, if it was not `current`.
            #[track_caller]
            pub fn compare_exchange_weak(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                ordered(success == SeqCst || failure == SeqCst, || {
                    self.0.compare_exchange_weak(current, new, success, failure)
                })
            }

            /// As the std method of the same name.
            ///
            /// # Errors
            ///
            /// The value found, if `f` returned `None` for it.
            #[track_caller]
            pub fn fetch_update<F>(
                &self,
                set_order: Ordering,
                fetch_order: Ordering,
                f: F,
            ) -> Result<$int, $int>
            where
                F: FnMut($int) -> Option<$int>,
            {
                ordered(set_order == SeqCst || fetch_order == SeqCst, || {
                    self.0.fetch_update(set_order, fetch_order, f)
                })
            }
        }
    };
}

atomic!(
    /// Loom's `AtomicU32`, with `SeqCst` modelled (see the module docs).
    AtomicU32,
    u32
);
atomic!(
    /// Loom's `AtomicU64`, with `SeqCst` modelled (see the module docs).
    AtomicU64,
    u64
);
atomic!(
    /// Loom's `AtomicUsize`, with `SeqCst` modelled (see the module docs).
    AtomicUsize,
    usize
);
