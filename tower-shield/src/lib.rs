//! The resilience stack for tower services in one line: the crate most
//! users add.
//!
//! A client stack per dependency (a deadline over the whole call, a circuit
//! breaker that counts every attempt, retries within a 10% budget, a
//! bulkhead, a per-attempt deadline written on the wire), a server stack
//! for `axum::Router::layer` (the caller's deadline, a bulkhead, a breaker,
//! every rejection an answer), and the integrations that put reqwest and
//! tonic at the bottom of a client stack.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, Layer, ServiceExt};
//! use tower_shield::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // The transport: hyper, reqwest (feature `reqwest`), a tonic Channel
//! // (feature `tonic`)...
//! let transport = service_fn(|_req: http::Request<_>| async {
//!     Ok::<_, BoxError>(http::Response::new(String::from("apples")))
//! });
//! let inventory = client_stack("inventory")
//!     .timeout(Duration::from_secs(2))
//!     .concurrency(32);
//! let breaker = inventory.breaker_handle().clone();
//! let client = inventory.layer(transport);
//!
//! let response = client.oneshot(http::Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! # drop(response);
//! assert_eq!(breaker.snapshot().state, State::Closed);
//! # Ok(())
//! # }
//! ```
//!
//! # What is where
//!
//! - [`stack`]: [`client_stack`] and [`server_stack`], their builders
//!   ([`ClientStack`], [`ServerStack`]) and the services they build.
//! - `reqwest` (feature `reqwest`): `client_stack(name).reqwest(client)`
//!   gives a client whose request builder is reqwest's own.
//! - `tonic` (feature `tonic`): `client_stack(name).tonic(channel)`, and
//!   every error of the stack as the right `tonic::Status`.
//! - `settings` (feature `serde`): both stacks and every layer's settings
//!   as data, one document for every dependency of a service (defaults and
//!   per-name overrides), and handles that apply new settings to running
//!   stacks keeping their state.
//! - `service_config` (feature `service-config`): gRPC service configs
//!   (gRFC A6) applied per method to a tonic client stack.
//! - `view` (feature `view`): the live view, every dependency's state as
//!   JSON and an HTML page polling it.
//! - [`prelude`]: the stacks, the layers and their errors, for a glob
//!   import.
//! - The four layers, each usable alone and re-exported here under a short
//!   name: [`deadline`] (`tower-deadline`), [`breaker`] (`tower-breaker`),
//!   [`retry`] (`tower-retry-budget`) and [`bulkhead`] (`tower-bulkhead`).
//!   A stack is exactly a `ServiceBuilder` of those layers (see [`stack`]),
//!   so composing them by hand stays possible.
//!
//! A fleet that shares one circuit adds a store crate
//! ([`tower-breaker-redis`](https://docs.rs/tower-breaker-redis),
//! [`tower-breaker-dynamodb`](https://docs.rs/tower-breaker-dynamodb)) and
//! gives it to the stack's breaker ([`ClientStack::breaker`]).
//!
//! # Feature flags
//!
//! | feature | default | what |
//! |---|---|---|
//! | `reqwest` | off | module `reqwest` (reqwest 0.13): `reqwest::Client` at the bottom of the client stack (`reqwest::ReqwestService`) and a `reqwest::Client` of this crate over it whose request builder is reqwest's own, delegated (`client.get(url).send().await`), built in one call by `ClientStack::reqwest`; reqwest without default features (bring your TLS backend) |
//! | `reqwest-query`, `reqwest-form`, `reqwest-json`, `reqwest-multipart` | off | the builder methods `query`, `form`, `json` and `multipart`, through reqwest's features of the same names; each enables `reqwest` |
//! | `reqwest-http2` | off | HTTP/2 for the reqwest transport (reqwest's `http2`), with the retry layer recognising HTTP/2 refusals, so that they are retried by the stack once reqwest's own retries are off; enables `reqwest` |
//! | `reqwest-middleware` | off | `reqwest::StackMiddleware`: the client stack as one `reqwest_middleware::Middleware`, still counting every attempt and replaying bodies |
//! | `tonic` | off | `tonic`: the client stack over a `tonic::transport::Channel` in one call (`client_stack(name).tonic(channel)`), replayable bodies included, and every error of the stack as the right `tonic::Status` |
//! | `serde` | off | module `settings`: settings files (TOML, YAML, JSON...) for both stacks and every layer (each layer crate's `serde` feature), named instances with defaults, reloads that keep state |
//! | `service-config` | off | module `service_config`: gRPC service configs (gRFC A6 retries, hedging, retry throttling) for a tonic client stack; enables `tonic` |
//! | `view` | off | module `view`: the live view (JSON snapshot, a service for an axum route, a self-contained HTML page) |
//! | `chaos` | off | `tower-chaos` re-exported as `chaos` (fault injection), its figures in the live view and its plan in the settings |
//! | `metrics` | off | every layer records through the [`metrics`](https://docs.rs/metrics) facade (each layer crate's `metrics` feature); the names are in `docs/metrics.md` at the repository's root |
//!
//! # Minimum supported Rust version
//!
//! The MSRV is the `rust-version` in `Cargo.toml`, the stable toolchain this
//! crate is built and tested with; raising it is not a breaking change but
//! is noted in the changelog.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod criticality;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;
#[cfg(feature = "service-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "service-config")))]
pub mod service_config;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;
pub mod stack;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod tonic;
#[cfg(feature = "view")]
#[cfg_attr(docsrs, doc(cfg(feature = "view")))]
pub mod view;

pub use stack::{client_stack, server_stack, ClientStack, ServerStack};

/// The circuit breaker: `tower-breaker`, re-exported.
pub use tower_breaker as breaker;
/// The bulkhead: `tower-bulkhead`, re-exported.
pub use tower_bulkhead as bulkhead;
/// Fault injection for game days (feature `chaos`): `tower-chaos`.
#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
pub use tower_chaos as chaos;
/// Deadlines: `tower-deadline`, re-exported.
pub use tower_deadline as deadline;
/// Retries and hedges within one budget: `tower-retry-budget`,
/// re-exported.
pub use tower_retry_budget as retry;

/// Any error of the stack as an HTTP or gRPC answer (503 with
/// `Retry-After` for an open circuit or a full bulkhead, 504 for a passed
/// deadline, ...), from `tower-resilience-base`.
pub use tower_resilience_base::Answer;
/// The boxed error type of the client stack, as in tower (the toolkit's
/// one definition, from `tower-resilience-base`).
pub use tower_resilience_base::BoxError;

/// The names a service that uses the stacks writes, for
/// `use tower_shield::prelude::*;`.
///
/// ```
/// use tower_shield::prelude::*;
///
/// let stack = client_stack("catalog").breaker(Breaker::with_config(
///     "catalog",
///     BreakerConfig::new().count_window(50),
/// ));
/// # let _ = stack;
/// ```
pub mod prelude {
    pub use crate::stack::{client_stack, server_stack, ClientStack, ServerStack};
    pub use tower_breaker::error::CircuitOpen;
    pub use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, HttpBreakerLayer, State};
    pub use tower_bulkhead::error::BulkheadFull;
    pub use tower_bulkhead::{BulkheadLayer, HttpBulkheadLayer};
    pub use tower_deadline::error::DeadlineExceeded;
    pub use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};
    pub use tower_resilience_base::{Answer, BoxError};
    pub use tower_retry_budget::{HedgeLayer, RetryLayer};
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
