//! Without the `metrics` feature: the same calls as [`metrics`], doing
//! nothing, so the breaker's code needs no `cfg` and pays nothing.

use crate::Mode;

/// No handles.
pub(crate) struct BreakerMetrics;

#[derive(Debug, Clone, Copy)]
pub(crate) enum ProbeResult {
    Success,
    Failure,
    Ignored,
    TimedOut,
}

// === impl BreakerMetrics ===

impl BreakerMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn success(&self) {}

    #[inline(always)]
    pub(crate) fn failure(&self) {}

    #[inline(always)]
    pub(crate) fn slow(&self) {}

    #[inline(always)]
    pub(crate) fn ignored(&self) {}

    #[inline(always)]
    pub(crate) fn stale(&self) {}

    #[inline(always)]
    pub(crate) fn rejected(&self) {}

    #[inline(always)]
    pub(crate) fn probe(&self, _result: ProbeResult) {}

    #[inline(always)]
    pub(crate) fn store_error(&self) {}

    #[inline(always)]
    pub(crate) fn transition(&self, _from: (crate::State, Mode), _to: (crate::State, Mode)) {}
}
