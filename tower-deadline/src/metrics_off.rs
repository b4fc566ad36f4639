//! Without the `metrics` feature: the same calls as [`metrics`], doing
//! nothing, so the layers' code needs no `cfg` and pays nothing.

use std::time::Duration;

/// No handles.
#[derive(Debug, Clone)]
pub(crate) struct ServerMetrics;

/// No handles.
#[derive(Debug, Clone)]
pub(crate) struct ClientMetrics;

/// No handle.
#[derive(Clone)]
pub(crate) struct Expiry;

// === impl ServerMetrics ===

impl ServerMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn received(&self, _budget: Duration) {}

    #[inline(always)]
    pub(crate) fn rejected(&self) {}

    #[inline(always)]
    pub(crate) fn expiry(&self) -> Expiry {
        Expiry
    }
}

// === impl ClientMetrics ===

impl ClientMetrics {
    #[inline(always)]
    pub(crate) fn new(_name: &str) -> Self {
        Self
    }

    #[inline(always)]
    pub(crate) fn rejected(&self) {}

    #[inline(always)]
    pub(crate) fn expiry(&self) -> Expiry {
        Expiry
    }
}

// === impl Expiry ===

impl Expiry {
    #[inline(always)]
    pub(crate) fn fire(&self) {}
}
