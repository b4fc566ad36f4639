//! Deadline propagation for tower services: one budget from the first
//! caller to the last callee.
//!
//! A server reads the caller's budget from `grpc-timeout` or an HTTP header,
//! turns it into an absolute [`Deadline`], and enforces it on the handler.
//! While the handler runs, every outgoing call made through
//! [`ClientDeadline`] inherits what is left of that budget, writes it into
//! its own request, and is cut when it runs out.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // A downstream dependency that reports the budget it was given.
//! let downstream = service_fn(|req: http::Request<()>| async move {
//!     let header = req.headers()["x-request-timeout-ms"].clone();
//!     Ok::<_, BoxError>(http::Response::new(header))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new())
//!     .service(downstream);
//!
//! // Our handler: it spends 100 ms, then calls the dependency.
//! let handler = service_fn(move |_req: http::Request<()>| {
//!     let client = client.clone();
//!     async move {
//!         assert!(Deadline::current().is_some());
//!         tokio::time::sleep(Duration::from_millis(100)).await;
//!         let answer = client.oneshot(http::Request::new(())).await?;
//!         // The body, out of the deadline's `body::ResponseBody`.
//!         let budget = answer.into_body().into_inner();
//!         Ok::<_, BoxError>(http::Response::new(budget.to_str()?.to_owned()))
//!     }
//! });
//! let server = ServiceBuilder::new()
//!     .layer(ServerDeadlineLayer::new())
//!     .service(handler);
//!
//! // The caller gives us 300 ms; the dependency is told 200 ms are left.
//! let request = http::Request::builder()
//!     .header("x-request-timeout-ms", "300")
//!     .body(())?;
//! let response = server.oneshot(request).await?;
//! assert_eq!(response.into_body().into_inner(), "200");
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! **Server side** ([`ServerDeadlineLayer`]):
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`http_header`](ServerDeadlineLayer::http_header) | `x-request-timeout-ms` | relative budget in whole milliseconds |
//! | [`grpc_timeout`](ServerDeadlineLayer::grpc_timeout) | on | read `grpc-timeout` (`1` to `8` digits and a unit `H M S m u n`) |
//! | [`default_timeout`](ServerDeadlineLayer::default_timeout) | none | budget when the caller sent none |
//! | [`max_timeout`](ServerDeadlineLayer::max_timeout) | [`DEFAULT_MAX_TIMEOUT`] (5 min) | clamp for larger budgets sent by callers (`Duration::MAX` lifts it); once set, it clamps the default budget too |
//! | [`min_remaining`](ServerDeadlineLayer::min_remaining) | zero | below it, answer at once without calling the handler |
//! | [`on_malformed`](ServerDeadlineLayer::on_malformed) | [`OnMalformed::Ignore`] | skip malformed values (logged) or answer 400 / INVALID_ARGUMENT if any value is malformed, or if `grpc-timeout` has more than one |
//! | [`grpc_lead`](ServerDeadlineLayer::grpc_lead) | 1 ms | gRPC requests expire this much early, to answer before tonic's own timer |
//!
//! The budget is relative on the wire (absolute times suffer from clock
//! skew) and absolute in the process: a [`Deadline`] is a
//! [`tokio::time::Instant`]. Every value counts: when both headers are
//! present, when one is sent twice, or when it holds a comma-separated list
//! (`x-request-timeout-ms: 200, 100`, which HTTP treats as two lines), the
//! shortest valid budget wins, the one reading no hop can lengthen by adding
//! a value. A caller's budget is clamped to five minutes unless
//! [`max_timeout`](ServerDeadlineLayer::max_timeout) says otherwise, so
//! `grpc-timeout: 99999999H` (eleven thousand years) cannot hold a handler
//! for ever; see [`DEFAULT_MAX_TIMEOUT`] for why five minutes. The deadline goes into the request's extensions and into a
//! task-local scope around the inner service's `call` and its future. When
//! it passes, the inner future is dropped, which cancels the handler and
//! every call it was awaiting, and the answer is `504 Gateway Timeout`, or
//! for gRPC requests (content type `application/grpc...`) an HTTP 200
//! trailers-only response with `grpc-status: 4` (DEADLINE_EXCEEDED).
//!
//! **Client side** ([`ClientDeadlineLayer`]):
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`default_timeout`](ClientDeadlineLayer::default_timeout) | none | timeout when no deadline is in scope; upper bound otherwise |
//! | [`margin`](ClientDeadlineLayer::margin) | zero | subtracted from the budget written on the wire |
//! | [`min_remaining`](ClientDeadlineLayer::min_remaining) | zero | below it, fail with [`InsufficientBudget`](error::InsufficientBudget) without calling |
//! | [`http_header`](ClientDeadlineLayer::http_header) | `x-request-timeout-ms` | header written on plain HTTP requests |
//! | [`grpc_timeout`](ClientDeadlineLayer::grpc_timeout) | on | write `grpc-timeout` on gRPC requests |
//! | [`head_only`](ClientDeadlineLayer::head_only) | off | stop at the response head (for an outer layer whose per-attempt layer bounds the body) |
//!
//! **Both sides bound the response body too** ([`body::ResponseBody`]): a
//! body still being read (client) or sent (server) when the deadline
//! passes fails on its next poll with
//! [`DeadlineExceeded`](error::DeadlineExceeded), or, for a server's gRPC
//! stream, ends with `grpc-status: 4` trailers. The timer is armed only
//! when the body waits, so a unary answer that is complete in its first
//! poll pays for none.
//!
//! The effective deadline is the earliest of the request's extension, the
//! task-local deadline and the default timeout. Its remaining time is
//! written into the outgoing request in `call`, so it is measured at the
//! moment the request is sent, and the call is cut when it passes. A
//! budget header already on the request is read like the server reads it
//! (shortest valid value) and is never forwarded malformed: it is replaced
//! by the fresh budget, or, when there is no deadline to write, removed.
//! Handlers
//! can read the deadline with [`Deadline::current`], [`current`],
//! [`remaining`] or from the request extensions.
//!
//! The [`codec`] module holds the strict parsers and formatters of both wire
//! formats.
//!
//! # Readiness
//!
//! Both layers forward the inner service's `poll_ready` unchanged and take
//! every decision in `call`. They never wait: an expired or too small budget
//! is answered (server) or fails (client) at once.
//!
//! # Errors
//!
//! [`ServerDeadline`] adds no error: its rejections are HTTP or gRPC
//! responses and the inner error type passes through, so it fits
//! `axum::Router::layer` as is. [`ClientDeadline`] fails with
//! [`BoxError`], which is either the inner service's error or one of
//! [`DeadlineExceeded`](error::DeadlineExceeded) (the call was cut) and
//! [`InsufficientBudget`](error::InsufficientBudget) (the call was not
//! made); see the [`error`] module for downcasting.
//!
//! # Ordering
//!
//! The server layer goes outermost, so the whole request, including other
//! middleware, runs under the caller's budget. On the client, the layer
//! goes *twice* around a retry layer, or once below it:
//!
//! ```text
//! ClientDeadlineLayer     one budget for the logical call (enforce_only)
//!   BreakerLayer / RetryLayer / BulkheadLayer
//!     ClientDeadlineLayer a fresh header for each attempt
//!       transport
//! ```
//!
//! The outer layer hands the deadline to the layers below in the
//! [`CallContext`] (no extension, no allocation) and cuts the whole call;
//! with [`enforce_only`](ClientDeadlineLayer::enforce_only) it writes no
//! header, since the per-attempt layer writes a fresh one on every attempt.
//! Timers are armed only when a call does not answer at once. The
//! per-attempt layer's expiry, not the outer one's, is what the retry layer
//! and the breaker between them see as a timed-out attempt (an expiry above
//! them only drops them, a cancellation), so both layers arm one.
//!
//! Placed only *above* a retry layer, the header is written once, before
//! the first attempt, and a retry sent after a backoff would tell the callee
//! it has more time than is left: prefer the layer below the retries.
//! Contrast with `tower::timeout::Timeout`, which gives every call a fixed
//! timeout regardless of how much of the caller's budget is left, and says
//! nothing to the callee.
//!
//! # Using with axum
//!
//! ```
//! use axum::{routing::get, Extension, Router};
//! use std::time::Duration;
//! use tower_deadline::{Deadline, ServerDeadlineLayer};
//!
//! async fn handler(Extension(deadline): Extension<Deadline>) -> String {
//!     format!("{} ms left", deadline.remaining().as_millis())
//! }
//!
//! let app: Router = Router::new().route("/", get(handler)).layer(
//!     ServerDeadlineLayer::new()
//!         .default_timeout(Duration::from_secs(5))
//!         .max_timeout(Duration::from_secs(30)),
//! );
//! # let _ = app;
//! ```
//!
//! With a default timeout, every request carries a [`Deadline`] extension;
//! without one, use `Option<Extension<Deadline>>` or [`Deadline::current`].
//!
//! # Using with tonic
//!
//! tonic's `Server` parses `grpc-timeout` itself and, when that timer fires,
//! answers CANCELLED. Its timer sits *outside* the layers added with
//! `Server::builder().layer(ServerDeadlineLayer::new())`, starts a few
//! microseconds earlier, and polls the inner future before itself. Both
//! timers usually fire in the same tick, and then this layer's answer wins;
//! to make sure it also wins when a millisecond boundary falls between the
//! two, this layer expires gRPC requests
//! [`grpc_lead`](ServerDeadlineLayer::grpc_lead) (1 ms) early. The caller
//! sees DEADLINE_EXCEEDED, never CANCELLED (`tests/tonic_server.rs` checks
//! both behaviours against a real tonic server). Serving the tonic routes
//! through `axum::serve` instead leaves this layer as the only timer.
//!
//! On the client side, tonic's `Channel` also runs a timer from the
//! `grpc-timeout` header it finds, which [`ClientDeadline`] writes when
//! stacked above the channel. When that timer and this layer's deadline
//! fire in the same tick, the caller gets
//! [`DeadlineExceeded`](error::DeadlineExceeded); with a
//! [`margin`](ClientDeadlineLayer::margin) the channel's timer fires first
//! and its own timeout error is returned unchanged.
//!
//! # Why propagate deadlines?
//!
//! A caller that gives up after 300 ms gains nothing from a callee that
//! works for 2 s: the answer is thrown away, and the work held a task, a
//! connection and a slot of concurrency all along. Fixed per-hop timeouts do
//! not compose (three tiers each with a 1 s timeout can make a user wait 3 s,
//! or keep working long after the user left). A single budget, carried as a
//! relative time on the wire and an absolute deadline inside each process,
//! lets every hop stop when the first caller stops, and lets a hop with too
//! little left refuse at once instead of starting work that cannot finish.
//!
//! # Pitfalls
//!
//! - The header names of client and server must agree; both default to
//!   `x-request-timeout-ms`.
//! - A server whose handlers legitimately run longer than five minutes must
//!   raise [`max_timeout`](ServerDeadlineLayer::max_timeout): callers'
//!   budgets above [`DEFAULT_MAX_TIMEOUT`] are clamped to it.
//! - A task spawned with `tokio::spawn` does not inherit the task-local
//!   deadline: wrap its future in [`Deadline::scope`] if it works on behalf
//!   of the request.
//! - The server layer cannot cancel work that outlives the handler's future
//!   (a spawned task, a blocking thread); it only drops what it owns.
//! - Streaming response bodies are not covered: the deadline ends when the
//!   response head is ready.
//!
//! # Feature flags
//!
//! | feature | default | what |
//! |---|---|---|
//! | `metrics` | off | `metrics`: budgets received (a histogram), expiries and fail-fast rejections through the [`metrics`](https://docs.rs/metrics) facade, labelled with the layer's name ([`ServerDeadlineLayer::name`], [`ClientDeadlineLayer::name`]); the full list of names is in `docs/metrics.md` at the repository's root |
//!
//! # Minimum supported Rust version
//!
//! The MSRV is the `rust-version` in `Cargo.toml`, the stable toolchain this
//! crate is built and tested with; raising it is not a breaking change but
//! is noted in the changelog.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod client;
pub mod codec;
mod deadline;
pub mod error;
pub mod future;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics_off;
#[cfg(not(feature = "metrics"))]
use metrics_off as metrics;
mod server;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;

pub use client::{ClientDeadline, ClientDeadlineLayer, TimeoutHandle};
pub use deadline::{current, remaining};
pub use server::{
    OnMalformed, ServerDeadline, ServerDeadlineLayer, DEFAULT_GRPC_LEAD, DEFAULT_HTTP_HEADER,
    DEFAULT_MAX_TIMEOUT, GRPC_TIMEOUT,
};
pub use tower_resilience_base::{CallContext, Deadline};

/// The boxed error type of [`ClientDeadline`], as in tower (the toolkit's
/// one definition, from `tower-resilience-base`).
pub use tower_resilience_base::BoxError;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
