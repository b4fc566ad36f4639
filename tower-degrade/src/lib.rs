#![doc = include_str!("guide.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cache;
mod cause;
pub mod future;
mod layer;
mod mark;
mod snapshot;
mod source;
mod sync;

pub use cause::{Cause, Causes};
pub use layer::{
    FallbackLayer, FallbackService, DEFAULT_ASYNC_LIMIT, DEFAULT_ASYNC_TIMEOUT,
    DEFAULT_EVENT_INTERVAL,
};
pub use mark::{FallbackServed, FALLBACK_AGE_HEADER, FALLBACK_HEADER};
pub use snapshot::{FallbackSnapshot, PerCause, ShadowCounts, StaleServed};
pub use source::{Fallback, Reason};

/// The boxed error type, as in tower (the toolkit's one definition, from
/// `tower-resilience-base`).
pub use tower_resilience_base::BoxError;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
