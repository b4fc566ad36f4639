//! The switch of a fault layer: its plan, on or off, and its figures.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::random::{unit, ProcessRandom, RandomSource};

use crate::plan::{Action, FaultKind, FaultPlan, FaultPlanError, Injection};

/// The switch of one or more fault layers: the plan they inject, whether
/// it is on, and how many faults they injected.
///
/// A handle starts **off**: its layers pass every call through after one
/// atomic load. [`set`](Self::set) applies a plan and turns it on, at run
/// time, atomically for every layer built from the handle (a call sees the
/// old plan or the new one, never a mix); [`off`](Self::off) turns it
/// off and keeps the plan for [`on`](Self::on). Turning it on logs a
/// `fault_injection_on` warning, off an info event; each fault injected
/// is a debug event `fault_injected` with `injected = true`, and is
/// counted in [`snapshot`](Self::snapshot) (and in
/// `tower_chaos_injected_total` with the `metrics` feature).
///
/// # Clone
///
/// Clones share everything (one `Arc`).
///
/// # Example
///
/// ```
/// use tower_chaos::{FaultHandle, FaultKind, FaultPlan};
///
/// let faults = FaultHandle::new("inventory");
/// faults.set(FaultPlan::new().error(0.1)).expect("valid");
/// // ... the game day ...
/// faults.off();
/// assert!(!faults.is_on());
/// assert_eq!(faults.snapshot().injected[FaultKind::Error.index()], 0);
/// ```
#[derive(Clone)]
pub struct FaultHandle {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    on: AtomicBool,
    plan: RwLock<Arc<FaultPlan>>,
    random: Arc<dyn RandomSource>,
    seen: AtomicU64,
    injected: [AtomicU64; 5],
}

/// A fault layer's figures; see [`FaultHandle::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultSnapshot {
    /// The layer's name.
    pub name: Arc<str>,
    /// Whether a plan is being injected.
    pub on: bool,
    /// Calls that were in the plan's scope while it was on (each drew its
    /// faults).
    pub eligible: u64,
    /// Faults injected since the handle was built, by
    /// [`FaultKind::index`].
    pub injected: [u64; 5],
}

impl FaultHandle {
    /// A handle named `name` (in its errors, events, metrics and marks),
    /// off, drawing from a [`ProcessRandom`].
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::with_random(name, Arc::new(ProcessRandom::new()))
    }

    /// A handle drawing its faults from `random` (a seeded source for
    /// reproducible tests).
    pub fn with_random(name: impl Into<Arc<str>>, random: Arc<dyn RandomSource>) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                on: AtomicBool::new(false),
                plan: RwLock::new(Arc::new(FaultPlan::new())),
                random,
                seen: AtomicU64::new(0),
                injected: Default::default(),
            }),
        }
    }

    /// The handle's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Applies `plan` and turns injection on (a plan that injects
    /// nothing turns it off).
    ///
    /// # Errors
    ///
    /// A [`FaultPlanError`] when the plan is invalid
    /// ([`FaultPlan::validate`]); the handle is left as it was.
    pub fn set(&self, plan: FaultPlan) -> Result<(), FaultPlanError> {
        plan.validate()?;
        let empty = plan.is_empty();
        *self
            .inner
            .plan
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(plan);
        if empty {
            self.off();
        } else {
            self.on();
        }
        Ok(())
    }

    /// Turns injection on with the current plan.
    pub fn on(&self) {
        if !self.inner.on.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                layer = %self.inner.name,
                plan = ?*self.plan(),
                "fault_injection_on: faults are being injected on purpose"
            );
        }
    }

    /// Turns injection off: every call passes through again. The plan is
    /// kept for [`on`](Self::on).
    pub fn off(&self) {
        if self.inner.on.swap(false, Ordering::AcqRel) {
            tracing::info!(layer = %self.inner.name, "fault_injection_off");
        }
    }

    /// Whether faults are being injected.
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.inner.on.load(Ordering::Relaxed)
    }

    /// The current plan.
    #[must_use]
    pub fn plan(&self) -> Arc<FaultPlan> {
        Arc::clone(
            &self
                .inner
                .plan
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The figures now.
    #[must_use]
    pub fn snapshot(&self) -> FaultSnapshot {
        FaultSnapshot {
            name: Arc::clone(&self.inner.name),
            on: self.is_on(),
            eligible: self.inner.seen.load(Ordering::Relaxed),
            injected: self
                .inner
                .injected
                .each_ref()
                .map(|n| n.load(Ordering::Relaxed)),
        }
    }

    /// The faults for one call of `criticality` to `key`; `None` when off
    /// or out of the plan's scope.
    #[inline]
    pub(crate) fn draw(&self, criticality: Criticality, key: Option<&str>) -> Option<Injection> {
        if !self.inner.on.load(Ordering::Relaxed) {
            return None;
        }
        self.draw_on(criticality, key)
    }

    #[cold]
    fn draw_on(&self, criticality: Criticality, key: Option<&str>) -> Option<Injection> {
        let inner = &*self.inner;
        let injection = {
            let plan = inner.plan.read().unwrap_or_else(PoisonError::into_inner);
            if !plan.covers(criticality, key) {
                return None;
            }
            plan.pick(unit(&*inner.random), unit(&*inner.random))
        };
        inner.seen.fetch_add(1, Ordering::Relaxed);
        if injection.delay.is_some() {
            self.count(FaultKind::Latency);
        }
        match injection.action {
            Action::None => {}
            Action::Error => self.count(FaultKind::Error),
            Action::Status(..) => self.count(FaultKind::Status),
            Action::Hang(_) => self.count(FaultKind::Hang),
            Action::Abort(_) => self.count(FaultKind::AbortBody),
        }
        (injection.delay.is_some() || injection.action != Action::None).then_some(injection)
    }

    fn count(&self, kind: FaultKind) {
        self.inner.injected[kind.index()].fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tower_chaos_injected_total",
            "layer" => self.inner.name.to_string(),
            "fault" => kind.as_str()
        )
        .increment(1);
        tracing::debug!(
            layer = %self.inner.name,
            fault = kind.as_str(),
            injected = true,
            "fault_injected"
        );
    }
}

impl fmt::Debug for FaultHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultHandle")
            .field("name", &&*self.inner.name)
            .field("on", &self.is_on())
            .finish_non_exhaustive()
    }
}
