//! The vocabulary that the tower resilience layers speak to each other.
//!
//! `tower-deadline`, `tower-retry-budget`, `tower-bulkhead` and
//! `tower-breaker` are each usable alone. Stacked, they cooperate: the
//! breaker sees every attempt of the retry layer below it, the retry layer
//! never sleeps past the deadline set above it, nobody retries a rejection
//! that a layer made on purpose, and every layer answers HTTP and gRPC
//! callers the same way. What they need to agree on lives here, once:
//!
//! | concept | here |
//! |---|---|
//! | the per-call context handed from layer to layer | [`CallContext`] |
//! | what a response or an error says about the dependency | [`classify`] |
//! | how a call counts for a layer that judges calls (breaker, fallback) | [`outcome`] |
//! | the caller's deadline, and the one of the request being served | [`Deadline`] |
//! | how an outer layer sees and gates every attempt | [`hook`] |
//! | the errors of local rejections and of spent retries | [`error`] |
//! | the do-not-retry mark, `Retry-After`, gRPC trailers-only answers | [`answer`] |
//! | gRPC status codes | [`grpc`] |
//! | the random source of jitter | [`random`] |
//! | a breaker's name, free to copy when written in the source | [`Name`] |
//! | a per-thread stripe for counters many threads update | [`stripe`] |
//!
//! Applications rarely use this crate directly: each layer crate re-exports
//! what its users need. Two things are for applications:
//! [`Answer::for_error`], which turns any error of a client stack into the
//! HTTP or gRPC answer a handler should give, and [`CallContext`], for
//! authors of their own layers.
//!
//! # Example
//!
//! A handler calls a dependency through a client stack and turns the
//! stack's error into the right answer:
//!
//! ```
//! use std::time::Duration;
//! use tower_resilience_base::error::CircuitOpen;
//! use tower_resilience_base::{Answer, BoxError};
//!
//! // What a client stack returns while the dependency's circuit is open.
//! let error: BoxError = Box::new(CircuitOpen::new("inventory", Duration::from_millis(2500), false));
//!
//! let response: http::Response<String> = Answer::for_error(&*error).into_response(false);
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["retry-after"], "3");
//! assert_eq!(response.headers()["x-tower-no-retry"], "1");
//! ```
//!
//! # Why a call context in a thread-local, not in extensions?
//!
//! `Service::call` is synchronous: when the outer layer calls the next one,
//! the whole chain down to the transport runs on this thread before `call`
//! returns. A layer that has something to tell the layers below (the
//! deadline, the clock reading it already made, the breaker's attempt
//! hook) installs a [`CallContext`] for the duration of its inner `call`;
//! the layers below read it there. That costs a thread-local access and no
//! allocation, where an entry in `http::Request::extensions` costs three on
//! a request without extensions, and a copy for every retry. The price is
//! that a layer which defers its inner `call` to later or to another task
//! (tower's `Buffer`, a spawn) cuts the chain: put such layers outside the
//! resilience stack (see [`CallContext`]'s docs).
//!
//! # Minimum supported Rust version
//!
//! The workspace's `rust-version` (the stable toolchain it is tested on).
//! Raising it is a minor version change.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod answer;
pub mod classify;
pub mod clock;
pub mod context;
pub mod criticality;
mod deadline;
pub mod error;
pub mod fleet;
pub mod grpc;
pub mod hook;
#[cfg(tower_resilience_loom)]
#[doc(hidden)]
pub mod loom_sync;
pub mod name;
pub mod outcome;
pub mod random;
pub mod seq;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;
pub mod stripe;
pub mod wake;

pub use answer::{Answer, NO_RETRY_HEADER};
pub use context::CallContext;
pub use deadline::Deadline;
pub use name::Name;

/// The error type of every layer that adds a failure of its own: the inner
/// service's error, or one of the errors in [`error`], boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
