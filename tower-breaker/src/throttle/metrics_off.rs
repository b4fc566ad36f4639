//! Without the `metrics` feature: the same calls as the `metrics` module,
//! doing nothing.

use tower_resilience_base::criticality::Criticality;

/// No handles.
pub(crate) struct ThrottleMetrics;

// === impl ThrottleMetrics ===

impl ThrottleMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn request(&self) {}

    #[inline(always)]
    pub(crate) fn accept(&self) {}

    #[inline(always)]
    pub(crate) fn rejected(&self, _criticality: Criticality) {}

    #[inline(always)]
    pub(crate) fn probability(&self, _p: f64) {}
}
