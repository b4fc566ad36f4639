//! Fault injection for tower services, for game days: latency, errors,
//! statuses, hangs and aborted response bodies, for a share of the
//! requests, off by default, switched at run time, every fault marked.
//!
//! A team that set deadlines, retries, a breaker, a bulkhead and
//! fallbacks wants to see them work before an outage shows them: inject
//! the outage. [`FaultLayer`] sits where the dependency's faults come from
//! (innermost, above the transport), draws for each call from the plan of
//! its [`FaultHandle`], and gives the call what a failing dependency
//! gives: a slower answer, a connection reset, a 503 (a trailers-only
//! `UNAVAILABLE` on gRPC), no answer at all, or a body that breaks off.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, Layer, ServiceExt};
//! use tower_chaos::{FaultHandle, FaultKind, FaultLayer, FaultPlan};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let faults = FaultHandle::new("inventory");
//! let client = FaultLayer::new(faults.clone()).layer(service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, BoxError>(http::Response::new(String::new()))
//! }));
//!
//! // The game day: a tenth of the calls 2 s slower, 5% reset.
//! faults.set(FaultPlan::new().latency(0.1, Duration::from_secs(2)).error(0.05))?;
//! for _ in 0..100 {
//!     let _ = client.clone().oneshot(http::Request::new(())).await;
//! }
//! faults.off();
//! let injected = faults.snapshot().injected;
//! assert!(injected[FaultKind::Latency.index()] > 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Never mistaken for a real fault
//!
//! - Errors are [`InjectedFault`]s: [`is_injected`] finds one along the
//!   source chain. Their source is the [`std::io::Error`] a real fault of
//!   the kind has (connection reset, timed out, connection aborted), so
//!   the breaker counts them and the retry layer retries them: the layers
//!   under test must not see the difference, the people must.
//! - Responses a fault touched (an injected status, a delayed answer, a
//!   body that will abort) carry the [`INJECTED_FAULT_HEADER`] and the
//!   [`Injected`] extension. An injected status is the dependency's answer
//!   as far as classifiers go (not a local answer).
//! - Turning a plan on is a `fault_injection_on` warning, off an info
//!   event; each fault is a debug event `fault_injected` with
//!   `injected = true`, counted in [`FaultHandle::snapshot`] and, with
//!   the `metrics` feature, in `tower_chaos_injected_total{layer, fault}`.
//!
//! # Scope and switching
//!
//! A plan can be narrowed to criticalities and to keys (the request's
//! host) ([`FaultPlan::only_criticalities`], [`FaultPlan::only_keys`]).
//! [`FaultHandle::set`] swaps the plan for every layer built from the
//! handle at once; a call draws from one plan, the old or the new. While
//! off, a call costs one relaxed atomic load.
//!
//! # Hangs
//!
//! A hung call answers nothing until the caller's deadline drops it, as a
//! hung dependency does, and fails by itself with an [`InjectedFault`]
//! after [`FaultPlan::max_hang`] (30 s by default) for callers without a
//! deadline. Nothing is held meanwhile but the call's own future.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod error;
pub mod future;
mod handle;
mod plan;
mod service;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;

pub use body::FaultBody;
pub use error::{is_injected, Injected, InjectedFault, INJECTED_FAULT_HEADER};
pub use handle::{FaultHandle, FaultSnapshot};
pub use plan::{FaultKind, FaultPlan, FaultPlanError, DEFAULT_MAX_HANG};
pub use service::{FaultInjection, FaultLayer, PlainFaultInjection, PlainFaultLayer};

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
