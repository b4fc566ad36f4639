//! Without the `metrics` feature: the same calls as [`metrics`], doing
//! nothing, so the layers' code needs no `cfg` and pays nothing.

/// No handles.
pub(crate) struct RetryMetrics;

/// No handles.
pub(crate) struct HedgeMetrics;

// === impl RetryMetrics ===

impl RetryMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn retried(&self) {}

    #[inline(always)]
    pub(crate) fn refused(&self) {}

    #[inline(always)]
    pub(crate) fn do_not_retry(&self) {}
}

// === impl HedgeMetrics ===

impl HedgeMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn sent(&self) {}

    #[inline(always)]
    pub(crate) fn won(&self) {}

    #[inline(always)]
    pub(crate) fn refused(&self) {}
}
