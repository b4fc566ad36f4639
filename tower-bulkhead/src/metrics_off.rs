//! Without the `metrics` feature: the same calls as [`metrics`], doing
//! nothing, so the compartment's code needs no `cfg` and pays nothing.

/// No handles.
#[derive(Clone)]
pub(crate) struct CompartmentMetrics;

// === impl CompartmentMetrics ===

impl CompartmentMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn taken(&self) {}

    #[inline(always)]
    pub(crate) fn released(&self) {}

    #[inline(always)]
    pub(crate) fn rejected(&self) {}

    #[inline(always)]
    pub(crate) fn limit(&self, _limit: usize) {}
}
