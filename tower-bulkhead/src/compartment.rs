//! One compartment: a concurrency limit made of a few atomics, the permits
//! that occupy it, and the read-only views of it.

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::stripe::thread_index;

use crate::adaptive::controller::{Controller, Ending, LimitSpec, NOT_TIMED};
use crate::error::BulkheadFull;
use crate::metrics::CompartmentMetrics;
use crate::sync::{AtomicU64, AtomicUsize, Notify, Ordering};
use tower_resilience_base::{CallContext, Name};

/// The least time between two rejection events of one compartment.
const LOG_INTERVAL_MS: u64 = 1_000;
/// `last_log_ms` before the first event.
const NEVER: u64 = u64::MAX;

/// The future a waiting call polls: a permit, or the rejection once
/// `max_wait` has passed. Boxed, because it only exists on the slow path.
pub(crate) type Acquire = Pin<Box<dyn Future<Output = Result<Permit, BulkheadFull>> + Send + Sync>>;

/// A concurrency limit shared by every call routed to it.
///
/// The hot path is one compare-and-swap to take a slot and one
/// `fetch_sub` plus one load to give it back; waiting calls (only with
/// `max_wait`) first take a waiter place with one more compare-and-swap
/// (so that at most `max_waiters` wait at once), then park on a [`Notify`]
/// and are woken one per released slot.
pub struct Compartment {
    in_flight: AtomicUsize,
    /// Waiter places taken: calls that found the compartment full and wait
    /// for a slot, from `call` until they get one, time out or are dropped.
    waiters: AtomicUsize,
    /// The limit: set once for a fixed compartment, moved by the
    /// controller of an adaptive one. A relaxed load is a plain load.
    limit: AtomicUsize,
    /// The adaptive state; `None` for a fixed compartment, whose hot path
    /// then does nothing more than before limits could adapt.
    adaptive: Option<Box<Controller>>,
    name: Name,
    /// Rejections, on the rejecting thread's stripe (see [`Striped`]).
    rejected: Striped,
    /// Of the rejections, those refused for their criticality.
    shed: AtomicU64,
    notify: Notify,
    /// Milliseconds since `epoch` of the last lookup (keyed compartments
    /// only; used for idle eviction).
    last_used_ms: AtomicU64,
    last_log_ms: AtomicU64,
    /// Rejections not logged since the last event, striped as `rejected`.
    suppressed: Striped,
    epoch: Instant,
    /// The `metrics` handles (nothing without the feature).
    metrics: CompartmentMetrics,
}

/// One occupied slot of a [`Compartment`]; dropping it frees the slot and
/// wakes one waiting call, if any.
///
/// It moves from `call` into the response future and, in body mode, into
/// the response body, so every way those end (completion, error, drop,
/// panic unwinding) gives the slot back.
pub struct Permit {
    compartment: Arc<Compartment>,
    /// Adaptive compartments only, packed so that a permit stays two words
    /// (every response future moves it): in the low [`START_BITS`] bits,
    /// when the call started (nanoseconds since the controller's epoch) if
    /// it is timed, else all ones; in the top two bits, how the call ended
    /// as the response future tells ([`Ending`]; a permit dropped untold
    /// is a call its caller dropped).
    meta: u64,
}

/// Bits of [`Permit::meta`] that hold the start: 2^62 ns, 146 years.
const START_BITS: u32 = 62;
const START_MASK: u64 = (1 << START_BITS) - 1;

/// One taken waiter place of a [`Compartment`]: a call that may wait for
/// a slot. Dropping it frees the place.
///
/// It is taken in `call` (so the bound holds from the moment the call is
/// admitted to wait, polled or not) and moves into the [`Acquire`] future,
/// so every way a wait ends (a slot, the timeout, a dropped future) gives
/// the place back. While it exists, a release knows someone may need a
/// wake-up.
struct WaiterPlace {
    compartment: Arc<Compartment>,
}

/// How a call that finds its compartment full may wait: the layer's
/// `max_wait` and `max_waiters`, copied into every service it wraps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WaitPolicy {
    /// How long a call may wait; `None` or zero: no waiting.
    pub(crate) max_wait: Option<Duration>,
    /// How many calls may wait at once per compartment; `None`: as many as
    /// the compartment's limit.
    pub(crate) max_waiters: Option<usize>,
}

/// Criticality shedding: a request of criticality `c` takes a slot only
/// while fewer than `share(c) * limit` are taken. Copied from the layer
/// into every service it wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shedding {
    /// Each criticality's share of the limit, in 1/1024ths.
    shares: [u32; 4],
    /// The lowest share: below it, no request's criticality is looked up.
    floor: u32,
}

// === impl Shedding ===

impl Shedding {
    /// No shedding: every criticality may use the whole limit.
    pub(crate) const OFF: Self = Self {
        shares: [1024; 4],
        floor: 1024,
    };

    /// The default shares: Sheddable 1/2, SheddablePlus 3/4, Critical and
    /// CriticalPlus the whole limit.
    pub(crate) const DEFAULT: Self = Self {
        shares: [512, 768, 1024, 1024],
        floor: 512,
    };

    /// Shares as fractions of the limit, each brought into `[0, 1]` (NaN:
    /// 1) and rounded to 1/1024.
    pub(crate) fn from_shares(shares: [f64; 4]) -> Self {
        let shares = shares.map(|s| {
            if s.is_nan() {
                1024
            } else {
                (s.clamp(0.0, 1.0) * 1024.0).round() as u32
            }
        });
        let floor = shares.iter().copied().min().unwrap_or(1024);
        Self { shares, floor }
    }

    /// The shares as fractions, for `Debug`.
    pub(crate) fn as_fractions(self) -> [f64; 4] {
        self.shares.map(|s| f64::from(s) / 1024.0)
    }

    /// How many calls in flight a share of `limit` allows (rounded up, so
    /// a share above zero of a limit above zero allows one call).
    #[inline]
    fn allowed(self, share: u32, limit: usize) -> usize {
        if share >= 1024 {
            limit
        } else {
            (limit.saturating_mul(share as usize)).div_ceil(1024)
        }
    }
}

impl Default for Shedding {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why a slot was not taken.
enum Refusal {
    Full,
    Shed(Criticality),
}

/// What `call` decided for one request.
pub(crate) enum Admission {
    /// A slot was free: call the inner service now.
    Go(Permit),
    /// Full, but `max_wait` allows waiting for a slot in the future, and a
    /// waiter place was free (and is now taken by the [`Acquire`]).
    Wait(Acquire),
    /// Full, and no waiting allowed or every waiter place taken: refuse
    /// now.
    Full(BulkheadFull),
}

/// A point-in-time reading of one compartment's counters.
///
/// The counters are read one after the other without a lock, so under load
/// the figures of one snapshot may be a few calls apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    in_flight: usize,
    limit: usize,
    waiting: usize,
    rejected: u64,
    shed: u64,
    bounds: Option<(usize, usize)>,
    recent_latency: Option<Duration>,
    no_load_latency: Option<Duration>,
}

/// A read-only view of one compartment: its name, limit and live counters.
///
/// Get one from [`BulkheadLayer::handle`](crate::BulkheadLayer::handle),
/// [`HttpBulkheadLayer::handle`](crate::HttpBulkheadLayer::handle) or, for
/// the fallback of a keyed bulkhead,
/// [`KeyedHandle::fallback`](crate::KeyedHandle::fallback).
///
/// # Clone
///
/// Clones look at the same compartment as the original.
#[derive(Clone)]
pub struct CompartmentHandle {
    compartment: Arc<Compartment>,
}

// === impl Compartment ===

impl Compartment {
    /// A fixed compartment of `limit` slots.
    #[cfg(test)]
    pub(crate) fn new(name: Name, limit: usize) -> Self {
        let metrics = CompartmentMetrics::new(&name);
        Self::with_epoch(name, &LimitSpec::Fixed(limit), Instant::now(), metrics)
    }

    /// A compartment recording into `metrics` (for a keyed bulkhead, the
    /// handles of the layer's name, shared by every key).
    pub(crate) fn with_epoch(
        name: Name,
        spec: &LimitSpec,
        epoch: Instant,
        metrics: CompartmentMetrics,
    ) -> Self {
        let (adaptive, limit) = match spec {
            LimitSpec::Fixed(limit) => (None, *limit),
            LimitSpec::Adaptive(factory) => {
                let (controller, initial) = Controller::new(factory(), epoch);
                (Some(Box::new(controller)), initial)
            }
        };
        metrics.limit(limit);
        Self {
            in_flight: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            adaptive,
            name,
            rejected: Striped::default(),
            shed: AtomicU64::new(0),
            notify: Notify::new(),
            last_used_ms: AtomicU64::new(0),
            last_log_ms: AtomicU64::new(NEVER),
            suppressed: Striped::default(),
            epoch,
            metrics,
        }
    }

    pub(crate) fn name(&self) -> &Name {
        &self.name
    }

    pub(crate) fn stats(&self) -> Stats {
        let adaptive = self.adaptive.as_deref();
        Stats {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            limit: self.limit(),
            waiting: self.waiters.load(Ordering::Relaxed),
            rejected: self.rejected.total(),
            shed: self.shed.load(Ordering::Relaxed),
            bounds: adaptive.map(Controller::bounds),
            recent_latency: adaptive.and_then(Controller::recent_latency),
            no_load_latency: adaptive.and_then(Controller::no_load_latency),
        }
    }

    /// The current limit.
    #[inline]
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn touch(&self, now_ms: u64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    pub(crate) fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Relaxed)
    }

    /// Takes a slot if one is free.
    ///
    /// `SeqCst` pairs with [`release`](Self::release): a waiter takes its
    /// place in `waiters` and then reads `in_flight` here, a release writes
    /// `in_flight` and then reads `waiters`, so at least one of them sees the
    /// other and no wake-up is lost. On x86 this costs nothing over
    /// `Acquire`.
    #[inline]
    fn try_take(&self) -> bool {
        self.try_take_ranked(Shedding::OFF, || Criticality::Critical)
            .is_ok()
    }

    /// Takes a slot if one is free for a request of this criticality
    /// (read only when the compartment is past the lowest share).
    #[inline]
    fn try_take_ranked(
        &self,
        shedding: Shedding,
        criticality: impl FnOnce() -> Criticality,
    ) -> Result<(), Refusal> {
        let limit = self.limit();
        let floor = shedding.allowed(shedding.floor, limit);
        let mut criticality = Some(criticality);
        let mut ranked = None;
        let mut current = self.in_flight.load(Ordering::SeqCst);
        loop {
            if current >= limit {
                return Err(Refusal::Full);
            }
            if current >= floor {
                let c = *ranked.get_or_insert_with(|| match criticality.take() {
                    Some(read) => read(),
                    None => Criticality::Critical,
                });
                if current >= shedding.allowed(shedding.shares[c.index()], limit) {
                    return Err(Refusal::Shed(c));
                }
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.metrics.taken();
                    return Ok(());
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes a waiter place if fewer than `max_waiters` are taken.
    ///
    /// A compare-and-swap, not an add-then-check, so that the count never
    /// goes past the bound, even for a moment, however many calls race.
    fn try_queue(&self, max_waiters: usize) -> bool {
        let mut current = self.waiters.load(Ordering::SeqCst);
        loop {
            if current >= max_waiters {
                return false;
            }
            match self.waiters.compare_exchange_weak(
                current,
                current + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    #[inline]
    fn release(&self, meta: u64) {
        if let Some(controller) = &self.adaptive {
            self.end_adaptive(controller, meta);
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.metrics.released();
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_one();
        }
    }

    /// Counts a rejection, logs it (rate limited) and builds the error.
    #[cold]
    /// The adaptive part of a release, out of line: a fixed compartment's
    /// release stays small enough to inline.
    #[inline(never)]
    fn end_adaptive(&self, controller: &Controller, meta: u64) {
        let start = meta & START_MASK;
        let start_ns = if start == START_MASK {
            NOT_TIMED
        } else {
            start
        };
        let ending = match meta >> START_BITS {
            0 => Ending::Dropped,
            1 => Ending::Completed,
            2 => Ending::Congested,
            _ => Ending::Ignored,
        };
        // The calls in flight as this one ends, itself included: the
        // concurrency it ran at, read once instead of carried by every
        // permit.
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        controller.end(
            &self.limit,
            &self.name,
            &self.metrics,
            start_ns,
            in_flight,
            ending,
        );
    }

    pub(crate) fn reject(&self, waited: Option<Duration>) -> BulkheadFull {
        self.rejected.add();
        self.metrics.rejected();
        self.log_rejection(waited, None);
        BulkheadFull::new(self.name.clone(), self.limit(), waited)
    }

    /// Counts a refusal for criticality (a rejection too), logs it (rate
    /// limited with the other rejections) and builds the error.
    #[cold]
    fn shed(&self, criticality: Criticality) -> BulkheadFull {
        self.rejected.add();
        self.shed.fetch_add(1, Ordering::Relaxed);
        self.metrics.rejected();
        self.log_rejection(None, Some(criticality));
        BulkheadFull::shed_for(self.name.clone(), self.limit(), criticality)
    }

    /// At most one `WARN` event per compartment per [`LOG_INTERVAL_MS`];
    /// the rejections in between are counted and reported with the next
    /// event as `suppressed`.
    ///
    /// The time is the call's clock reading when a layer above made one
    /// (the [`CallContext`]'s, as in a client stack), so that rejections
    /// under overload do not each read the clock: that reading is at most
    /// as old as the call, which delays a warning by as much at worst.
    fn log_rejection(&self, waited: Option<Duration>, shed: Option<Criticality>) {
        if !tracing::enabled!(tracing::Level::WARN) {
            return;
        }
        let now = CallContext::current(CallContext::now).unwrap_or_else(Instant::now);
        let now_ms = millis_since(self.epoch, now);
        let last = self.last_log_ms.load(Ordering::Relaxed);
        let due = last == NEVER || now_ms >= last.saturating_add(LOG_INTERVAL_MS);
        if due
            && self
                .last_log_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.take();
            match shed {
                None => tracing::warn!(
                    compartment = %self.name,
                    limit = self.limit(),
                    suppressed,
                    waited_ms = waited.map_or(0, |w| w.as_millis() as u64),
                    "bulkhead full; call rejected"
                ),
                Some(criticality) => tracing::warn!(
                    compartment = %self.name,
                    limit = self.limit(),
                    suppressed,
                    criticality = criticality.as_str(),
                    "bulkhead over the share of this criticality; call shed"
                ),
            }
        } else {
            self.suppressed.add();
        }
    }
}

/// Stripes of a [`Striped`] counter.
const STRIPES: usize = 8;

/// A counter that every thread adds to under overload (the rejections): one
/// cache line per thread stripe, summed when read. With one shared word,
/// two threads rejecting at once each waited for the other's increment,
/// which doubled the cost of a rejection (`--bench overhead`, "two
/// threads").
#[derive(Default)]
struct Striped([StripedSlot; STRIPES]);

#[derive(Default)]
#[repr(align(128))]
struct StripedSlot(AtomicU64);

impl Striped {
    #[inline]
    fn add(&self) {
        self.0[thread_index() % STRIPES]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        self.0
            .iter()
            .map(|slot| slot.0.load(Ordering::Relaxed))
            .sum()
    }

    /// The total, leaving zero behind (an add racing with it counts
    /// either now or in the next total, never in neither).
    fn take(&self) -> u64 {
        self.0
            .iter()
            .map(|slot| slot.0.swap(0, Ordering::Relaxed))
            .sum()
    }
}

impl fmt::Debug for Compartment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = self.stats();
        f.debug_struct("Compartment")
            .field("name", &self.name)
            .field("limit", &stats.limit)
            .field("in_flight", &stats.in_flight)
            .field("waiting", &stats.waiting)
            .field("rejected", &stats.rejected)
            .finish()
    }
}

pub(crate) fn millis_since(epoch: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch).as_millis()).unwrap_or(u64::MAX)
}

// === impl Admission ===

impl Admission {
    /// Takes a slot of `compartment` if one is free; otherwise waits (if
    /// `max_wait` is set and not zero, and a waiter place is free) or
    /// refuses at once.
    ///
    /// With `shedding`, a request over its criticality's share is refused
    /// at once (it never waits); `criticality` is called at most once, and
    /// only when the compartment is past the lowest share.
    #[inline]
    pub(crate) fn decide(
        compartment: &Arc<Compartment>,
        policy: WaitPolicy,
        shedding: Shedding,
        criticality: impl FnOnce() -> Criticality,
    ) -> Self {
        match compartment.try_take_ranked(shedding, criticality) {
            Ok(()) => return Self::Go(Permit::new(compartment)),
            Err(Refusal::Shed(c)) => return Self::Full(compartment.shed(c)),
            Err(Refusal::Full) => {}
        }
        match policy.max_wait {
            Some(wait) if !wait.is_zero() => {
                let max_waiters = policy.max_waiters.unwrap_or_else(|| compartment.limit());
                match WaiterPlace::try_take(compartment, max_waiters) {
                    Some(place) => Self::Wait(Permit::acquire_within(place, wait)),
                    None => Self::Full(compartment.reject(None)),
                }
            }
            _ => Self::Full(compartment.reject(None)),
        }
    }
}

// === impl Permit ===

impl Permit {
    /// A permit of `compartment`, if it has a free slot. Never waits.
    #[cfg(test)]
    #[inline]
    pub(crate) fn try_acquire(compartment: &Arc<Compartment>) -> Option<Self> {
        compartment.try_take().then(|| Self::new(compartment))
    }

    /// The permit of a slot just taken (the controller reads the calls in
    /// flight at the release); in an adaptive compartment, timed if the
    /// sampler says so.
    #[inline]
    fn new(compartment: &Arc<Compartment>) -> Self {
        let meta = match &compartment.adaptive {
            Some(controller) => match controller.start() {
                NOT_TIMED => START_MASK,
                // An epoch 146 years old cannot be; saturate anyway.
                start => start.min(START_MASK - 1),
            },
            None => START_MASK,
        };
        Self {
            compartment: compartment.clone(),
            meta,
        }
    }

    #[inline]
    fn set_ending(&mut self, ending: u64) {
        self.meta = (self.meta & START_MASK) | ending << START_BITS;
    }

    /// Whether this permit's compartment adapts its limit (and so wants to
    /// know how calls end).
    #[inline]
    pub(crate) fn is_adaptive(&self) -> bool {
        self.compartment.adaptive.is_some()
    }

    /// The call completed (a response): a latency sample if timed.
    #[inline]
    pub(crate) fn completed(&mut self) {
        self.set_ending(1);
    }

    /// The call ended in congestion: a deadline, a timeout, an overloaded
    /// answer.
    pub(crate) fn congested(&mut self) {
        self.set_ending(2);
    }

    /// The call failed in a way that says nothing about load.
    pub(crate) fn ignored(&mut self) {
        self.set_ending(3);
    }

    /// Waits up to `max_wait` for a slot of the compartment whose waiter
    /// `place` this call holds; the rejection after that is counted like
    /// any other. The place is given back when the wait ends, whichever
    /// way: a slot, the timeout, or the future dropped.
    ///
    /// Waiters are woken in the order they started waiting (one per freed
    /// slot), but the wait is not a strict queue: a call that arrives just
    /// as a slot frees may take it first, and the woken waiter then waits
    /// again for what is left of its time.
    fn acquire_within(place: WaiterPlace, max_wait: Duration) -> Acquire {
        Box::pin(async move {
            let outcome = tokio::time::timeout(max_wait, wait_for_slot(&place.compartment)).await;
            let compartment = place.compartment.clone();
            // The wait is over: free the place before anything else, so
            // that a new call can queue as soon as this one is answered.
            drop(place);
            match outcome {
                Ok(()) => Ok(Self::new(&compartment)),
                Err(_elapsed) => Err(compartment.reject(Some(max_wait))),
            }
        })
    }
}

/// Resolves once this call holds a slot of `compartment` (the caller turns
/// it into a [`Permit`]); dropping it before then leaves no trace. The
/// caller holds a [`WaiterPlace`] throughout, so releases wake it.
async fn wait_for_slot(compartment: &Compartment) {
    loop {
        let mut notified = pin!(compartment.notify.notified());
        // Join the queue before looking at the counter, so that a release
        // between the look and the wait still wakes us.
        notified.as_mut().enable();
        if compartment.try_take() {
            return;
        }
        notified.await;
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        self.compartment.release(self.meta);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("compartment", &self.compartment.name)
            .finish()
    }
}

// === impl WaiterPlace ===

impl WaiterPlace {
    /// A waiter place of `compartment`, if fewer than `max_waiters` are
    /// taken. Never waits.
    fn try_take(compartment: &Arc<Compartment>, max_waiters: usize) -> Option<Self> {
        if compartment.try_queue(max_waiters) {
            Some(Self {
                compartment: compartment.clone(),
            })
        } else {
            None
        }
    }
}

impl Drop for WaiterPlace {
    fn drop(&mut self) {
        self.compartment.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

// === impl Stats ===

impl Stats {
    /// Calls holding a slot right now (taken and not yet released).
    #[must_use]
    pub const fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The compartment's capacity: the most calls it lets through at once.
    /// For an adaptive compartment, its current limit, which may be below
    /// [`in_flight`](Self::in_flight) just after it shrank.
    #[must_use]
    pub const fn limit(&self) -> usize {
        self.limit
    }

    /// Calls refused for their criticality (over its share of the limit;
    /// see [`BulkheadLayer::criticality_shares`](crate::BulkheadLayer::criticality_shares)),
    /// included in [`rejected`](Self::rejected).
    #[must_use]
    pub const fn shed(&self) -> u64 {
        self.shed
    }

    /// Whether the limit adapts
    /// ([`BulkheadLayer::adaptive`](crate::BulkheadLayer::adaptive)).
    #[must_use]
    pub const fn is_adaptive(&self) -> bool {
        self.bounds.is_some()
    }

    /// The bounds `(min, max)` of an adaptive limit; `None` for a fixed
    /// one.
    #[must_use]
    pub const fn limit_bounds(&self) -> Option<(usize, usize)> {
        self.bounds
    }

    /// The mean latency of the timed calls of the last window that had any
    /// (adaptive compartments only): what calls take now.
    #[must_use]
    pub const fn recent_latency(&self) -> Option<Duration> {
        self.recent_latency
    }

    /// The latency the algorithm measured without load (adaptive
    /// compartments whose algorithm measures one, like
    /// [`Gradient`](crate::adaptive::Gradient)), as of the last window.
    #[must_use]
    pub const fn no_load_latency(&self) -> Option<Duration> {
        self.no_load_latency
    }

    /// Free slots right now: `limit - in_flight` (zero when an adaptive
    /// limit has just shrunk below the calls in flight).
    #[must_use]
    pub const fn available(&self) -> usize {
        self.limit.saturating_sub(self.in_flight)
    }

    /// Calls waiting for a slot right now (only with `max_wait`): calls
    /// that found the compartment full and took a waiter place, counted
    /// from their `call` until they get a slot, time out or are dropped.
    /// Never more than the `max_waiters` of the layers that route calls
    /// here (see [`BulkheadLayer::max_waiters`](crate::BulkheadLayer::max_waiters)).
    #[must_use]
    pub const fn waiting(&self) -> usize {
        self.waiting
    }

    /// Calls refused since the compartment was created: at once (full and
    /// no waiter place free, or no waiting allowed) or after waiting
    /// `max_wait` in vain.
    #[must_use]
    pub const fn rejected(&self) -> u64 {
        self.rejected
    }
}

// === impl CompartmentHandle ===

impl CompartmentHandle {
    pub(crate) fn new(compartment: Arc<Compartment>) -> Self {
        Self { compartment }
    }

    /// The compartment's name, as carried by
    /// [`BulkheadFull::compartment`].
    #[must_use]
    pub fn name(&self) -> &str {
        &self.compartment.name
    }

    /// Reads all counters at once; see [`Stats`].
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.compartment.stats()
    }

    /// Calls holding a slot right now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.stats().in_flight
    }

    /// Calls waiting for a slot right now; see [`Stats::waiting`].
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.compartment.waiters.load(Ordering::Relaxed)
    }

    /// Calls refused so far.
    #[must_use]
    pub fn rejected(&self) -> u64 {
        self.compartment.rejected.total()
    }

    /// The most calls the compartment lets through at once.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.compartment.limit()
    }

    /// Whether the compartment's limit adapts
    /// ([`BulkheadLayer::adaptive`](crate::BulkheadLayer::adaptive)).
    #[must_use]
    pub fn is_adaptive(&self) -> bool {
        self.compartment.adaptive.is_some()
    }

    /// Changes a fixed compartment's limit at run time, for every service
    /// built from it; returns the limit it had.
    ///
    /// Nothing else changes: calls in flight keep their slots (after a cut
    /// below them, new calls are refused until enough have ended), the
    /// counters go on, and calls waiting for a slot (`max_wait`) are woken
    /// to take the new ones. The change is one atomic store: a call sees
    /// the old limit or the new one.
    ///
    /// # Errors
    ///
    /// [`SetLimitError::Zero`] for a limit of 0 (use a breaker forced open
    /// to refuse everything), [`SetLimitError::Adaptive`] for an adaptive
    /// compartment (its algorithm owns the limit: change its bounds by
    /// building another); the limit is left as it was.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_bulkhead::{BulkheadLayer, SetLimitError};
    ///
    /// let layer = BulkheadLayer::new("search", 16);
    /// let handle = layer.handle();
    /// assert_eq!(handle.set_limit(4), Ok(16));
    /// assert_eq!(handle.limit(), 4);
    /// assert_eq!(handle.set_limit(0), Err(SetLimitError::Zero));
    /// ```
    pub fn set_limit(&self, limit: usize) -> Result<usize, SetLimitError> {
        let compartment = &self.compartment;
        if limit == 0 {
            return Err(SetLimitError::Zero);
        }
        if compartment.adaptive.is_some() {
            return Err(SetLimitError::Adaptive);
        }
        let old = compartment.limit.swap(limit, Ordering::SeqCst);
        compartment.metrics.limit(limit);
        // One wake-up per new slot, for the calls waiting for one.
        let waiting = compartment.waiters.load(Ordering::SeqCst);
        for _ in 0..limit.saturating_sub(old).min(waiting) {
            compartment.notify.notify_one();
        }
        tracing::info!(
            compartment = %compartment.name,
            from = old,
            to = limit,
            "bulkhead_limit_changed"
        );
        Ok(old)
    }
}

/// Why [`CompartmentHandle::set_limit`] refused a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetLimitError {
    /// A limit of 0.
    Zero,
    /// The compartment's limit is adaptive: its algorithm sets it.
    Adaptive,
}

impl fmt::Display for SetLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetLimitError::Zero => f.write_str(
                "a bulkhead limit of 0 would refuse every call; force a breaker open instead",
            ),
            SetLimitError::Adaptive => f.write_str(
                "the compartment's limit is adaptive: its algorithm sets it, within the bounds it was built with",
            ),
        }
    }
}

impl std::error::Error for SetLimitError {}

impl fmt::Debug for CompartmentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.compartment, f)
    }
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

#[cfg(test)]
mod tests {
    use super::*;

    fn compartment(limit: usize) -> Arc<Compartment> {
        Arc::new(Compartment::new("test".into(), limit))
    }

    #[test]
    fn permits_count_against_the_limit_and_release_on_drop() {
        let c = compartment(2);
        let a = Permit::try_acquire(&c).unwrap();
        let b = Permit::try_acquire(&c).unwrap();
        assert!(Permit::try_acquire(&c).is_none());
        assert_eq!(c.stats().in_flight(), 2);
        drop(a);
        assert_eq!(c.stats().available(), 1);
        let _c = Permit::try_acquire(&c).unwrap();
        drop(b);
        assert_eq!(c.stats().in_flight(), 1);
    }

    #[test]
    fn zero_limit_rejects_everything() {
        let c = compartment(0);
        assert!(Permit::try_acquire(&c).is_none());
    }

    fn waiting(wait_ms: u64, max_waiters: Option<usize>) -> WaitPolicy {
        WaitPolicy {
            max_wait: Some(Duration::from_millis(wait_ms)),
            max_waiters,
        }
    }

    /// `Some(waited)` if the call was refused at once, `None` if it got a
    /// slot or may wait (the admission is kept alive in `held`).
    fn refused(
        c: &Arc<Compartment>,
        policy: WaitPolicy,
        held: &mut Vec<Admission>,
    ) -> Option<Duration> {
        match Admission::decide(c, policy, Shedding::OFF, || Criticality::Critical) {
            Admission::Full(full) => Some(full.waited()),
            other => {
                held.push(other);
                None
            }
        }
    }

    #[test]
    fn waiter_places_are_bounded_and_each_refusal_past_them_is_immediate() {
        let c = compartment(1);
        let mut held = Vec::new();
        let policy = waiting(100, Some(2));
        assert_eq!(refused(&c, policy, &mut held), None, "takes the slot");
        assert_eq!(refused(&c, policy, &mut held), None, "first waiter");
        assert_eq!(refused(&c, policy, &mut held), None, "second waiter");
        assert_eq!(c.stats().waiting(), 2);
        assert_eq!(refused(&c, policy, &mut held), Some(Duration::ZERO));
        assert_eq!(c.stats().waiting(), 2);
        assert_eq!(c.stats().rejected(), 1);

        // Dropping a waiter (its `Acquire`) frees its place.
        drop(held.pop());
        assert_eq!(c.stats().waiting(), 1);
        assert_eq!(refused(&c, policy, &mut held), None);
        drop(held);
        assert_eq!(c.stats().waiting(), 0);
        assert_eq!(c.stats().in_flight(), 0);
    }

    #[test]
    fn the_default_waiter_bound_is_the_limit() {
        let c = compartment(2);
        let mut held = Vec::new();
        let policy = waiting(100, None);
        for _ in 0..4 {
            assert_eq!(refused(&c, policy, &mut held), None);
        }
        assert_eq!(c.stats().in_flight(), 2);
        assert_eq!(c.stats().waiting(), 2);
        assert_eq!(refused(&c, policy, &mut held), Some(Duration::ZERO));
    }

    #[test]
    fn no_waiter_place_is_taken_without_max_wait_or_with_zero_waiters() {
        let c = compartment(1);
        let mut held = Vec::new();
        assert_eq!(refused(&c, WaitPolicy::default(), &mut held), None);
        assert!(refused(&c, WaitPolicy::default(), &mut held).is_some());
        assert!(refused(&c, waiting(0, Some(5)), &mut held).is_some());
        assert!(refused(&c, waiting(100, Some(0)), &mut held).is_some());
        assert_eq!(c.stats().waiting(), 0);
        assert_eq!(c.stats().rejected(), 3);
    }

    #[test]
    fn a_kill_switch_refuses_at_once_even_with_max_wait() {
        let c = compartment(0);
        let mut held = Vec::new();
        assert_eq!(
            refused(&c, waiting(100, None), &mut held),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn the_handle_reads_the_live_counters() {
        let c = compartment(3);
        let handle = CompartmentHandle::new(c.clone());
        let _held = Permit::try_acquire(&c).unwrap();
        let _ = c.reject(None);
        assert_eq!(handle.name(), "test");
        assert_eq!(handle.limit(), 3);
        assert_eq!(handle.in_flight(), 1);
        assert_eq!(handle.rejected(), 1);
        assert_eq!(handle.waiting(), 0);
        assert_eq!(handle.stats(), c.stats());
    }

    #[test]
    fn debug_shows_the_name_and_the_counters() {
        let c = compartment(3);
        let permit = Permit::try_acquire(&c).unwrap();
        let handle = CompartmentHandle::new(c.clone());
        assert_eq!(
            format!("{handle:?}"),
            r#"Compartment { name: "test", limit: 3, in_flight: 1, waiting: 0, rejected: 0 }"#
        );
        assert_eq!(format!("{permit:?}"), r#"Permit { compartment: "test" }"#);
    }

    /// The fast path never looks a request's criticality up: only past
    /// the lowest share, and then once per call.
    #[test]
    fn the_criticality_is_read_only_past_the_lowest_share() {
        let c = compartment(4);
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Criticality::Sheddable
        };
        let mut held = Vec::new();
        for _ in 0..2 {
            match Admission::decide(&c, WaitPolicy::default(), Shedding::DEFAULT, read) {
                Admission::Go(permit) => held.push(permit),
                _ => panic!("under half: admitted"),
            }
        }
        assert_eq!(reads.get(), 0, "2 of 4 taken, none looked up");
        let third = Admission::decide(&c, WaitPolicy::default(), Shedding::DEFAULT, read);
        assert!(matches!(third, Admission::Full(_)));
        assert_eq!(reads.get(), 1);
        assert_eq!(c.stats().shed(), 1);
        let off = Admission::decide(&c, WaitPolicy::default(), Shedding::OFF, read);
        assert!(matches!(off, Admission::Go(_)));
        assert_eq!(reads.get(), 1, "no shares, no look-up");
    }

    #[test]
    fn shares_round_up_and_are_brought_into_range() {
        let s = Shedding::from_shares([0.5, 0.75, 2.0, f64::NAN]);
        assert_eq!(s, Shedding::DEFAULT);
        assert_eq!(s.allowed(512, 3), 2);
        assert_eq!(s.allowed(512, 1), 1);
        assert_eq!(s.allowed(0, 100), 0);
        assert_eq!(s.allowed(1024, 7), 7);
        assert_eq!(Shedding::from_shares([-1.0; 4]).as_fractions(), [0.0; 4]);
    }

    #[test]
    fn rejections_from_many_threads_are_each_counted_once() {
        let c = compartment(0);
        std::thread::scope(|scope| {
            for _ in 0..12 {
                scope.spawn(|| {
                    for _ in 0..1_000 {
                        let _ = c.reject(None);
                        c.suppressed.add();
                    }
                });
            }
        });
        // 12 threads over 8 stripes: some share one, and none is lost.
        assert_eq!(c.stats().rejected(), 12_000);
        assert_eq!(c.suppressed.take(), 12_000);
        assert_eq!(c.suppressed.take(), 0, "taken, the count starts over");
        assert_eq!(c.stats().rejected(), 12_000, "a total does not reset");
    }

    #[test]
    fn reject_counts_and_names_the_compartment() {
        let c = compartment(1);
        let err = c.reject(None);
        assert_eq!(err.compartment(), "test");
        assert_eq!(c.stats().rejected(), 1);
    }
}
