//! What a fallback layer counts, and how its events are rate limited.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cause::Cause;
use crate::sync::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Relaxed, Release},
};

/// The figures of a [`FallbackLayer`](super::FallbackLayer) since it was
/// built, from [`FallbackLayer::snapshot`](super::FallbackLayer::snapshot).
///
/// Each figure is one relaxed atomic load: figures read while calls
/// complete may disagree by the calls in flight. Calls that pass through
/// without a fallback are not counted here (the happy path counts
/// nothing); count them where you count requests.
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_degrade::{Cause, Fallback, FallbackLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = FallbackLayer::plain(Fallback::value(String::from("default")));
/// let down = service_fn(|_req: ()| async { Err::<String, BoxError>("refused".into()) });
/// let client = layer.layer(down);
///
/// assert_eq!(client.oneshot(()).await.unwrap(), "default");
/// let snapshot = layer.snapshot();
/// assert_eq!(snapshot.served.get(Cause::Failure), 1);
/// assert_eq!(snapshot.served.total(), 1);
/// assert_eq!(snapshot.unanswered.total(), 0);
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FallbackSnapshot {
    /// The layer's name (see [`FallbackLayer::name`](super::FallbackLayer::name)).
    pub name: Arc<str>,
    /// Fallback answers served, by cause; [`Cause::Exercise`] counts the
    /// answers the exercise mode served on purpose.
    pub served: PerCause,
    /// Times the fallback was asked and gave nothing (every source failed,
    /// panicked or had nothing fresh enough), by cause: the caller got the
    /// original error or response. Under [`Cause::Exercise`], exercised
    /// calls whose fallback gave nothing (they were then sent to the
    /// dependency). Any figure here is a fallback that does not work.
    pub unanswered: PerCause,
    /// Answers served from a last-good cache, and how stale they were.
    pub stale: StaleServed,
    /// What the shadow mode found.
    pub shadow: ShadowCounts,
    /// Exercised or shadowed calls for a cold key: the chain gave nothing
    /// only because its last-good cache has no fresh answer for the key yet
    /// (its first calls, or a key not called within the maximum
    /// staleness). Not a broken fallback, so not in
    /// [`unanswered`](Self::unanswered) nor in
    /// [`shadow.unanswered`](ShadowCounts::unanswered), and no warning; a
    /// figure that grows while [`served`](Self::served) under
    /// [`Cause::Exercise`] stays at zero says the cache never keeps
    /// anything (a classifier that calls no response a success, a capacity
    /// of zero).
    pub cold: u64,
    /// Asynchronous sources being awaited now.
    pub async_waiting: usize,
    /// Entries in the last-good cache now (zero without one).
    pub cached: usize,
}

/// A count per [`Cause`].
///
/// # Example
///
/// ```
/// use tower_degrade::{Cause, Fallback, FallbackLayer};
///
/// let snapshot = FallbackLayer::plain(Fallback::<(), u8>::value(0)).snapshot();
/// assert_eq!(snapshot.served.get(Cause::CircuitOpen), 0);
/// assert_eq!(snapshot.served.iter().count(), Cause::ALL.len());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerCause {
    counts: [u64; Cause::ALL.len()],
}

/// Answers served from a [last-good cache](super::Fallback::last_good)
/// (by failure or by exercise), and their ages, in whole milliseconds.
///
/// # Example
///
/// ```
/// let stale = tower_degrade::StaleServed::default();
/// assert_eq!(stale.mean_age(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StaleServed {
    /// Cached answers served.
    pub served: u64,
    /// The sum of their ages.
    pub total_age: Duration,
    /// The oldest one served.
    pub max_age: Duration,
}

/// What the shadow mode found: for sampled healthy calls, whether the
/// fallback would have answered, and whether its answer agreed with the
/// dependency's (see [`FallbackLayer::compare`](super::FallbackLayer::compare)).
///
/// # Example
///
/// ```
/// let shadow = tower_degrade::ShadowCounts::default();
/// assert_eq!(shadow.compared(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShadowCounts {
    /// The fallback answered, and agreed with the dependency.
    pub agreed: u64,
    /// The fallback answered, and differed from the dependency.
    pub differed: u64,
    /// The fallback gave no answer: had the dependency failed, the caller
    /// would have had the error.
    pub unanswered: u64,
}

/// The counters behind [`FallbackSnapshot`], shared by every clone of a
/// layer, and the rate limits of its events.
pub(crate) struct Stats {
    served: [AtomicU64; Cause::ALL.len()],
    unanswered: [AtomicU64; Cause::ALL.len()],
    stale_served: AtomicU64,
    stale_age_total_ms: AtomicU64,
    stale_age_max_ms: AtomicU64,
    shadow_agreed: AtomicU64,
    shadow_differed: AtomicU64,
    shadow_unanswered: AtomicU64,
    cold: AtomicU64,
    async_waiting: AtomicUsize,
    pub(crate) served_gate: Gate,
    pub(crate) failed_gate: Gate,
    pub(crate) shadow_gate: Gate,
}

/// At most one event per interval: the next time one may be emitted, in
/// milliseconds since an epoch.
pub(crate) struct Gate {
    epoch: Instant,
    next_ms: AtomicU64,
}

// === impl PerCause ===

impl PerCause {
    /// The count for `cause`.
    #[must_use]
    pub const fn get(&self, cause: Cause) -> u64 {
        self.counts[cause.index()]
    }

    /// The sum over every cause.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Every cause with its count, in the order of [`Cause::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (Cause, u64)> + '_ {
        Cause::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

// === impl StaleServed ===

impl StaleServed {
    /// The mean age of the cached answers served, if any were.
    #[must_use]
    pub fn mean_age(&self) -> Option<Duration> {
        if self.served == 0 {
            return None;
        }
        // In nanoseconds over u128: a count beyond `u32::MAX` (a
        // long-lived layer) still has a mean.
        let mean = self.total_age.as_nanos() / u128::from(self.served);
        Some(Duration::from_nanos(
            u64::try_from(mean).unwrap_or(u64::MAX),
        ))
    }
}

// === impl ShadowCounts ===

impl ShadowCounts {
    /// Shadow calls whose fallback answered and was compared.
    #[must_use]
    pub const fn compared(&self) -> u64 {
        self.agreed + self.differed
    }
}

// === impl Stats ===

impl Stats {
    pub(crate) fn new() -> Self {
        let epoch = Instant::now();
        Self {
            served: Default::default(),
            unanswered: Default::default(),
            stale_served: AtomicU64::new(0),
            stale_age_total_ms: AtomicU64::new(0),
            stale_age_max_ms: AtomicU64::new(0),
            shadow_agreed: AtomicU64::new(0),
            shadow_differed: AtomicU64::new(0),
            shadow_unanswered: AtomicU64::new(0),
            cold: AtomicU64::new(0),
            async_waiting: AtomicUsize::new(0),
            served_gate: Gate::new(epoch),
            failed_gate: Gate::new(epoch),
            shadow_gate: Gate::new(epoch),
        }
    }

    /// Counts an answer served for `cause`; returns the total served.
    pub(crate) fn served(&self, cause: Cause, stale_for: Option<Duration>) -> u64 {
        if let Some(age) = stale_for {
            let ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
            self.stale_served.fetch_add(1, Relaxed);
            self.stale_age_total_ms.fetch_add(ms, Relaxed);
            self.stale_age_max_ms.fetch_max(ms, Relaxed);
        }
        self.served[cause.index()].fetch_add(1, Relaxed);
        self.served.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Counts a fallback that gave nothing for `cause`; returns the total.
    pub(crate) fn unanswered(&self, cause: Cause) -> u64 {
        self.unanswered[cause.index()].fetch_add(1, Relaxed);
        self.unanswered.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Counts a shadow comparison (`Some(agreed)`) or a shadow call
    /// without an answer (`None`).
    pub(crate) fn shadow(&self, agreed: Option<bool>) {
        let counter = match agreed {
            Some(true) => &self.shadow_agreed,
            Some(false) => &self.shadow_differed,
            None => &self.shadow_unanswered,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Counts an exercised or shadowed call for a cold key.
    pub(crate) fn cold(&self) {
        self.cold.fetch_add(1, Relaxed);
    }

    /// A permit to await an asynchronous source, if fewer than `limit` are
    /// awaited.
    pub(crate) fn async_permit(self: &Arc<Self>, limit: usize) -> Option<AsyncPermit> {
        let mut waiting = self.async_waiting.load(Relaxed);
        loop {
            if waiting >= limit {
                return None;
            }
            match self
                .async_waiting
                .compare_exchange_weak(waiting, waiting + 1, AcqRel, Relaxed)
            {
                Ok(_) => return Some(AsyncPermit(self.clone())),
                Err(now) => waiting = now,
            }
        }
    }

    pub(crate) fn snapshot(&self, name: Arc<str>, cached: usize) -> FallbackSnapshot {
        let load = |counters: &[AtomicU64; Cause::ALL.len()]| PerCause {
            counts: std::array::from_fn(|i| counters[i].load(Relaxed)),
        };
        FallbackSnapshot {
            name,
            served: load(&self.served),
            unanswered: load(&self.unanswered),
            stale: StaleServed {
                served: self.stale_served.load(Relaxed),
                total_age: Duration::from_millis(self.stale_age_total_ms.load(Relaxed)),
                max_age: Duration::from_millis(self.stale_age_max_ms.load(Relaxed)),
            },
            shadow: ShadowCounts {
                agreed: self.shadow_agreed.load(Relaxed),
                differed: self.shadow_differed.load(Relaxed),
                unanswered: self.shadow_unanswered.load(Relaxed),
            },
            cold: self.cold.load(Relaxed),
            async_waiting: self.async_waiting.load(Relaxed),
            cached,
        }
    }
}

/// One asynchronous source awaited; dropping it frees its place.
pub(crate) struct AsyncPermit(Arc<Stats>);

impl Drop for AsyncPermit {
    fn drop(&mut self) {
        self.0.async_waiting.fetch_sub(1, Release);
    }
}

impl fmt::Debug for AsyncPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AsyncPermit")
    }
}

// === impl Gate ===

impl Gate {
    fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether an event may be emitted now; if so, closes the gate for
    /// `interval`. Exactly one of concurrent callers wins.
    pub(crate) fn pass(&self, interval: Duration) -> bool {
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Relaxed);
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms.saturating_add(interval_ms), Relaxed, Relaxed)
                .is_ok()
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn gate_opens_once_per_interval() {
        let gate = Gate::new(Instant::now());
        let second = Duration::from_secs(1);
        assert!(gate.pass(second));
        assert!(!gate.pass(second));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!gate.pass(second));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(gate.pass(second));
    }

    #[test]
    fn counts_stale_ages() {
        let stats = Stats::new();
        stats.served(Cause::Failure, Some(Duration::from_secs(3)));
        stats.served(Cause::CircuitOpen, Some(Duration::from_secs(1)));
        assert_eq!(stats.served(Cause::CircuitOpen, None), 3);
        let s = stats.snapshot("x".into(), 0);
        assert_eq!(s.served.get(Cause::CircuitOpen), 2);
        assert_eq!(s.stale.served, 2);
        assert_eq!(s.stale.max_age, Duration::from_secs(3));
        assert_eq!(s.stale.mean_age(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn each_cause_has_its_own_count_and_the_total_adds_them() {
        let stats = Stats::new();
        for (i, &cause) in Cause::ALL.iter().enumerate() {
            for _ in 0..=i {
                stats.served(cause, None);
                stats.unanswered(cause);
                stats.unanswered(cause);
            }
        }
        // 1 + 2 + ... + 8 served, twice that unanswered.
        assert_eq!(stats.served(Cause::Failure, None), 37);
        assert_eq!(stats.unanswered(Cause::Exercise), 73);
        let s = stats.snapshot("layer".into(), 7);
        assert_eq!(&*s.name, "layer");
        assert_eq!(s.cached, 7);
        let served: Vec<(Cause, u64)> = s.served.iter().collect();
        let expected: Vec<(Cause, u64)> = Cause::ALL
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u64 + 1 + u64::from(c == Cause::Failure)))
            .collect();
        assert_eq!(served, expected, "in the order of Cause::ALL");
        assert_eq!(s.served.total(), 37);
        assert_eq!(s.served.get(Cause::BulkheadFull), 2);
        assert_eq!(s.unanswered.get(Cause::CircuitOpen), 2);
        assert_eq!(s.unanswered.get(Cause::Exercise), 17);
        assert_eq!(s.unanswered.total(), 73);
        assert_eq!(s.stale, StaleServed::default(), "nothing stale was served");
    }

    #[test]
    fn shadow_outcomes_and_cold_keys_are_counted_apart() {
        let stats = Stats::new();
        stats.shadow(Some(true));
        for _ in 0..2 {
            stats.shadow(Some(false));
        }
        for _ in 0..4 {
            stats.shadow(None);
        }
        stats.cold();
        stats.cold();
        let s = stats.snapshot("x".into(), 0);
        let shadow = s.shadow;
        assert_eq!(
            (shadow.agreed, shadow.differed, shadow.unanswered),
            (1, 2, 4)
        );
        assert_eq!(shadow.compared(), 3, "agreed and differed; not unanswered");
        assert_eq!(s.cold, 2);
        assert_eq!(s.served.total() + s.unanswered.total(), 0);
    }

    #[test]
    fn the_mean_age_needs_an_answer_and_survives_any_count() {
        let stale = |served, total_age| StaleServed {
            served,
            total_age,
            max_age: Duration::ZERO,
        };
        assert_eq!(stale(0, Duration::from_secs(5)).mean_age(), None);
        assert_eq!(
            stale(1, Duration::from_secs(5)).mean_age(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            stale(4, Duration::from_secs(10)).mean_age(),
            Some(Duration::from_millis(2_500))
        );
        let many = 5_000_000_000; // beyond u32
        assert_eq!(
            stale(many, Duration::from_secs(many) * 3).mean_age(),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn async_permits_stop_at_the_limit_and_free_their_place_on_drop() {
        let stats = Arc::new(Stats::new());
        let a = stats.async_permit(2).expect("first of two");
        let b = stats.async_permit(2).expect("second of two");
        assert!(stats.async_permit(2).is_none(), "the limit is reached");
        assert_eq!(stats.snapshot("x".into(), 0).async_waiting, 2);
        drop(a);
        assert_eq!(stats.snapshot("x".into(), 0).async_waiting, 1);
        let c = stats.async_permit(2).expect("a place was freed");
        assert!(
            stats.async_permit(0).is_none(),
            "a limit of zero awaits nothing"
        );
        assert_eq!(format!("{c:?}"), "AsyncPermit");
        drop((b, c));
        assert_eq!(stats.snapshot("x".into(), 0).async_waiting, 0);
    }

    #[test]
    fn racing_threads_never_hold_more_async_permits_than_the_limit() {
        const LIMIT: usize = 3;
        let stats = Arc::new(Stats::new());
        let held = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let granted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (stats, held, most, granted) =
                    (stats.clone(), held.clone(), most.clone(), granted.clone());
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        if let Some(permit) = stats.async_permit(LIMIT) {
                            let now = held.fetch_add(1, Relaxed) + 1;
                            most.fetch_max(now, Relaxed);
                            granted.fetch_add(1, Relaxed);
                            std::hint::spin_loop();
                            held.fetch_sub(1, Relaxed);
                            drop(permit);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(most.load(Relaxed) <= LIMIT, "held at once: {most:?}");
        assert!(
            granted.load(Relaxed) > 0,
            "a refusal means a permit is held"
        );
        assert_eq!(stats.snapshot("x".into(), 0).async_waiting, 0, "none lost");
    }
}
