#![doc = include_str!("guide.md")]

mod cache;
mod cause;
pub mod future;
mod layer;
mod mark;
mod snapshot;
mod source;

pub use cause::{Cause, Causes};
pub use layer::{FallbackLayer, FallbackService, DEFAULT_EVENT_INTERVAL};
pub use mark::{FallbackServed, FALLBACK_AGE_HEADER, FALLBACK_HEADER};
pub use snapshot::{FallbackSnapshot, PerCause, ShadowCounts, StaleServed};
pub use source::{Fallback, Reason};
