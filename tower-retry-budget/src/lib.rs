//! Retries for tower services that cannot turn into a retry storm: full
//! jitter, a 10% retry budget, deadline awareness and one tier of retries.
//! Hedged requests, which answer slowness from the same budget, are in
//! [`hedge`].
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::{body::ReplayBody, RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // A dependency that is unavailable once, then answers.
//! let calls = Arc::new(AtomicUsize::new(0));
//! let dependency = service_fn({
//!     let calls = calls.clone();
//!     move |_req: http::Request<ReplayBody<String>>| {
//!         let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             let mut response = http::Response::new("ok");
//!             if first {
//!                 *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
//!             }
//!             Ok::<_, BoxError>(response)
//!         }
//!     }
//! });
//!
//! let layer = RetryLayer::new();
//! let client = ServiceBuilder::new().layer(layer.clone()).service(dependency);
//!
//! let response = client.oneshot(http::Request::new(String::new())).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! assert_eq!(layer.counters().retries, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! For each request, [`Retry`] counts the request in the budget and sends
//! it. When the outcome is a *retryable failure* and the request may be
//! repeated, it sleeps a jittered backoff and sends it again, until it
//! succeeds or a limit says stop. What it checks, in order:
//!
//! 1. **Is the failure retryable?** Asked of the [`Policy`] (default
//!    [`DefaultPolicy`]), which is a [`Classify`]: the toolkit's one
//!    classification, which a circuit breaker above reads too (each
//!    attempt's [`Class`] is handed to it). Retried: the classes that
//!    [`Class::is_retryable`] names, by default errors whose kind says the next attempt may
//!    succeed (connection refused, reset or aborted, a connection closed
//!    before the answer, I/O and per-attempt timeouts:
//!    [`policy::is_transient_error`]; never an invalid URI, a TLS failure
//!    or a builder error), `502`, `503`, `504`; `429` only with a `Retry-After`;
//!    a trailers-only gRPC answer with `grpc-status: 14` (UNAVAILABLE).
//!    Never other 4xx or 5xx. A `Retry-After` (delta seconds or HTTP date)
//!    or a `grpc-retry-pushback-ms` sets the least delay; a negative or
//!    malformed pushback means never. Whatever the policy says, a response
//!    carrying [`NO_RETRY_HEADER`] and a local rejection
//!    ([`policy::is_local_rejection`]: an open circuit, a full bulkhead, a
//!    spent deadline, retries already spent below) are never retried.
//! 2. **May the request be repeated?** It must be idempotent (`GET`,
//!    `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`) or carry an
//!    `Idempotency-Key` header; the rule is the policy's
//!    [`is_retryable_request`](Policy::is_retryable_request). Its body must
//!    be replayable (see [`body`]).
//! 3. **Attempts:** at most [`max_attempts`](RetryLayer::max_attempts) in
//!    total.
//! 4. **Server delay:** a server may not ask for more than
//!    [`max_server_delay`](RetryLayer::max_server_delay).
//! 5. **Deadline:** the delay is the backoff, or the server's delay if
//!    longer. If the call has a deadline (the earliest of the one a
//!    `tower_deadline::ClientDeadline` above set in the call context, a
//!    `Deadline` in the request's extensions and the task-local deadline of
//!    the request being served), the retry is made only if at
//!    least [`min_remaining`](RetryLayer::min_remaining) is left after the
//!    delay: the layer never sleeps past the deadline, and never starts an
//!    attempt that cannot get the minimum slice.
//! 6. **Budget:** the [`RetryBudget`] must have room (see below).
//!
//! The first check that fails ends the retries, and the outcome says which
//! ([`StopReason`]): a response gets a [`GaveUp`] extension, and an error
//! ended by a limit is wrapped in the error that names it (see
//! [`error`]).
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`max_attempts`](RetryLayer::max_attempts) | 3 | attempts in total, the first included |
//! | [`backoff`](RetryLayer::backoff) | full jitter, 50 ms base, 1 s cap | `random(0, min(cap, base * 2^n))` before retry `n`; [`Backoff::decorrelated`] as an option |
//! | [`random`](RetryLayer::random) | [`ProcessRandom`] | per-request jitter seeds; [`SeededRandom`] in tests |
//! | [`budget`](RetryLayer::budget) | [`RetryBudget::new`] | shared by every service of the layer |
//! | [`RetryBudget::ratio`] | 0.1 | retries per request over the window |
//! | [`RetryBudget::min_per_sec`] | 5 | least retries per second of window (a minimum, not added to the share) |
//! | [`RetryBudget::window`] | 10 s | sliding window, ten buckets |
//! | [`min_remaining`](RetryLayer::min_remaining) | 10 ms | least deadline slice for an attempt |
//! | [`max_server_delay`](RetryLayer::max_server_delay) | 10 s | longest `Retry-After` / pushback obeyed |
//! | [`body_limit`](RetryLayer::body_limit) | 64 KiB | most request body bytes buffered for replay |
//! | [`clone_bodies`](RetryLayer::clone_bodies) | off | replay `Clone` bodies by cloning instead |
//! | [`attempt_header`](RetryLayer::attempt_header) | [`RETRY_ATTEMPT_HEADER`] | attempt number on HTTP retries |
//! | [`policy`](RetryLayer::policy) | [`DefaultPolicy`] | what is retried |
//!
//! **Jitter is per request.** Each request that needs a retry draws one
//! seed from the [`RandomSource`] and its own delays from it, so requests
//! that fail together come back at different moments.
//!
//! **The budget.** Over a sliding window, retries may be at most
//! `max(ratio * requests, min_per_sec * window)`: the share is exact, and
//! the floor is a minimum for quiet clients, never added to the share. Every request deposits one;
//! every retry withdraws one or is refused. A retry that never reaches the
//! dependency gives its withdrawal back: refused by the breaker's hook,
//! dropped during its backoff, or refused at once by a layer below (a full
//! bulkhead, a throttle). The budget lives in the layer,
//! so every service built by [`Layer::layer`](tower_layer::Layer::layer)
//! (axum and hyper call it once per connection) and every clone share it.
//! Counting a request and claiming a retry are lock-free; see
//! [`RetryBudget`].
//!
//! **Retry in one tier.** When a limit (attempts, budget, deadline) ends
//! the retries of a retryable failure that is a response, the layer sets
//! [`NO_RETRY_HEADER`] (`x-tower-no-retry: 1`) on it, so that a tier above
//! that uses this crate does not retry it again. When this layer receives a
//! response carrying that header, it does not retry it and passes it on
//! *with* the header ([`StopReason::SpentBelow`]): the mark means "retries
//! for this failure were already spent below", so no tier above the one
//! that retried retries it either. On a gRPC response, a give-up also sets
//! `grpc-retry-pushback-ms: -1`, gRPC's own "do not retry". The bulkhead
//! and breaker of this toolkit put the same header on their `503` answers.
//! Errors ended by a limit become this crate's errors, which another
//! [`Retry`] never retries. At the edge, strip the mark from answers to
//! callers that are not yours with
//! `ServiceBuilder::new().map_response(tower_resilience_base::answer::strip_no_retry)`
//! (a gateway forwarding a dependency's answer would otherwise pass it on).
//!
//! **Retries say so on the wire.** Every retry (never the first attempt)
//! carries its attempt number: `grpc-previous-rpc-attempts` (the number of
//! earlier attempts) on gRPC requests (content type
//! `application/grpc...`), [`RETRY_ATTEMPT_HEADER`] (`x-retry-attempt`,
//! the attempt's number, 2 for the first retry) on others.
//!
//! **The breaker hook.** When a breaker above offers its [`AttemptHook`] in
//! the call context (`tower_resilience_base::CallContext`), the layer takes
//! it and reports every attempt's outcome to it, asks it before sleeping
//! each backoff (so the call that trips the circuit returns `CircuitOpen`
//! at once, and spends no budget), and admits every retry through it; an
//! `Err` stops the retries at once with that error. An attempt the caller
//! abandons is given back to the hook, never lost. The hook sees each
//! response through its status and headers, so it does not depend on the
//! response type. See [`AttemptHook`].
//!
//! **The call context.** Each attempt is sent with its number
//! (`CallContext::attempt`) and the clock reading of the call in the
//! context, so the layers below read neither extensions nor the clock
//! again; the request's head is copied only when the request may be
//! retried.
//!
//! **Observability.** A `tracing` event at `DEBUG` for every retry
//! (`attempt`, `delay_ms`, `reason`), every refusal by the budget and every
//! give-up; counters of requests, retries and refusals from
//! [`RetryLayer::counters`] and [`Retry::counters`].
//!
//! # Readiness
//!
//! `poll_ready` forwards the inner service's readiness, nothing else: the
//! decision to retry is taken in the response future, which polls its own
//! clone of the inner service (see
//! [the service the retries go through](Retry#the-service-the-retries-go-through))
//! for readiness before each retry. The layer
//! never waits in `poll_ready` for a budget or a backoff.
//!
//! # Errors
//!
//! The error type is [`BoxError`]. It is the inner service's error
//! unchanged when the error was not retryable, the hook's error when the
//! hook stopped the retries, and [`AttemptsExhausted`](error::AttemptsExhausted),
//! [`BudgetExhausted`](error::BudgetExhausted) or
//! [`DeadlineTooClose`](error::DeadlineTooClose) (with the last error as
//! `source()`) when a limit ended the retries of a retryable error.
//! Downcast them with `err.is::<T>()` or `err.downcast_ref::<T>()`; see
//! [`error`].
//!
//! # Ordering
//!
//! The order of the toolkit, outermost first:
//!
//! ```text
//! ClientDeadlineLayer  one budget for the whole logical call (enforce_only)
//! BreakerLayer         fails fast while open; sees every attempt through the hook
//! RetryLayer           this crate: backoff, budget, stops when the breaker opens
//! BulkheadLayer        caps attempts in flight; its rejections are not retried
//! ClientDeadlineLayer  a fresh deadline header and cut-off for each attempt
//! transport
//! ```
//!
//! The breaker goes *outside* the retries but still counts every attempt:
//! it offers its [`AttemptHook`] in the call context, and this layer reports
//! each attempt to it and asks it before each backoff and retry. Contrast with the two
//! naive stacks:
//!
//! ```text
//! BreakerLayer   sees one failure where           RetryLayer     retries against an
//!   RetryLayer   the dependency saw three           BreakerLayer   open circuit: every
//!     transport                                       transport    retry fails fast,
//!                                                                  for nothing
//! ```
//!
//! A timeout per attempt goes *below* this layer (so each attempt is cut,
//! and a timeout is retried); a timeout for the whole call goes above it.
//! With `tower-deadline`, a `DeadlineExceeded` from a `ClientDeadlineLayer`
//! below this one is such a per-attempt timeout, and is retried, as long as
//! the call's own deadline (from the call context, the request's extensions
//! or the task-local scope) leaves more than [`min_remaining`](RetryLayer::min_remaining);
//! once the call's deadline is what passed, it is returned unchanged.
//! Load shedding goes above it: a shed request must not be retried.
//!
//! # Using with axum and HTTP clients
//!
//! This layer is for the *client* side: wrap the client a handler uses to
//! call its dependencies, not the router. With hyper's client the inner
//! service receives [`body::ReplayBody`], a `Body` with `Bytes` data:
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::body::ReplayBody;
//! use tower_retry_budget::RetryLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // Stands for `hyper_util::client::legacy::Client<_, ReplayBody<Full<Bytes>>>`.
//! let transport = service_fn(|_req: http::Request<ReplayBody<Full<Bytes>>>| async {
//!     Ok::<_, Infallible>(http::Response::new(()))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new())
//!     .service(transport);
//!
//! // Build it once per process (or share the layer), and clone it per call.
//! let request = http::Request::get("http://inventory/items")
//!     .body(Full::new(Bytes::from_static(b"")))?;
//! let response = client.clone().oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! Inside an axum handler, the task-local deadline set by
//! `tower_deadline::ServerDeadlineLayer` is picked up automatically, so the
//! retries of a dependency call stop in time for the caller. For tonic
//! channels and other clients whose body type is fixed, keep [`Buffered`]
//! bodies and map the body type, or use
//! [`clone_bodies`](RetryLayer::clone_bodies) when the body is `Clone`.
//!
//! # Why a budget instead of max retries?
//!
//! A maximum number of attempts bounds the retries of *one* request; it
//! does nothing for the load when *every* request fails. With three
//! attempts, a dependency that is down receives three times its normal
//! traffic, exactly when it can least afford it, and three tiers that each
//! retry three times send it 27 calls per user action. A budget bounds the
//! retries of the whole client: with 10%, a dependency that is down sees at
//! most about 1.1 times the requests, while isolated failures of a healthy
//! dependency are still retried (they are far fewer than 10%). The floor
//! keeps that true for quiet clients.
//!
//! We default to 10%, the figure of Google's SRE book, rather than the 20%
//! of Finagle, Envoy and tower, for three reasons. Budgets compound across
//! tiers: 20% is 1.2x per tier and 1.73x across three, 10% is 1.33x (and
//! with the do-not-retry mark passed up the chain, only one tier retries a
//! given failure: 1.1x in all).
//! The extra load arrives exactly when the dependency is overloaded or
//! recovering, and every retry it cannot serve delays its recovery. And a
//! healthy dependency fails far less than 10% of the time, so the stricter
//! ratio costs nothing in normal operation: it only bites during an
//! incident, when retries no longer help anyway.
//!
//! # Pitfalls
//!
//! - **Build the layer once.** The budget is created by
//!   [`RetryLayer::new`]; a layer built per request gets a fresh budget each
//!   time and never refuses anything.
//! - **Handlers that rebuild answers drop the signal.** A handler that maps
//!   a downstream failure to its own response must copy [`NO_RETRY_HEADER`]
//!   (or add it) for the tier above to see it; the layer does so on the
//!   responses it returns, not on the handler's.
//! - **Keep the chain synchronous.** The hook and the deadline reach this
//!   layer through the call context, during `call`; a layer between the
//!   breaker and this one that calls its inner service later or on another
//!   task (tower's `Buffer`) cuts the chain, and the breaker then counts
//!   each call once. Put such layers outside the stack.
//! - **A `POST` needs a key.** Non-idempotent requests are never retried
//!   unless they carry `Idempotency-Key`, which the server must honour.
//! - **A response body that fails is not retried.** Retries are decided on
//!   the response head (or the error) of each attempt; once a head is
//!   handed to the caller, a body that fails or stalls while it is read
//!   (a reset connection, a `DeadlineExceeded` from a `ClientDeadline`
//!   below) reaches the caller as a body error, and the layer cannot send
//!   the request again: part of the answer is already out. A breaker above
//!   counts that body failure once, as the last attempt's outcome (its hook
//!   keeps a good head's outcome open until the body ends).
//! - **Large request bodies are sent once.** Raise
//!   [`body_limit`](RetryLayer::body_limit) or use
//!   [`clone_bodies`](RetryLayer::clone_bodies) if they must be retried.
//! - **Time is paused in tests, not the wall clock.** `Retry-After` HTTP
//!   dates are compared with `SystemTime::now()`.
//!
//! # Feature flags
//!
//! The layer cooperates with the deadline, bulkhead and breaker layers
//! without any feature: the vocabulary they share (the call context, the
//! attempt hook, the errors) lives in `tower-resilience-base`.
//!
//! - `tower`: implement `tower::retry::budget::Budget` for [`RetryBudget`],
//!   so it can back `tower::retry` policies too.
//! - `hyper`: retry hyper's transient errors, recognised by type
//!   (`hyper::Error`: the connection closed, an incomplete message, a
//!   canceled request, hyper's timeouts).
//! - `h2`: retry HTTP/2 refusals (REFUSED_STREAM, GOAWAY with NO_ERROR),
//!   recognised by type (`h2::Error`).
//! - `metrics`: record retries, budget refusals, do-not-retry stops and
//!   hedges (sent, won) through the [`metrics`](https://docs.rs/metrics)
//!   facade, labelled with the layer's [`name`](RetryLayer::name) (module
//!   `metrics`; every name is listed in `docs/metrics.md` at the
//!   repository's root).
//!
//! # Minimum supported Rust version
//!
//! The MSRV is the `rust-version` in `Cargo.toml`, the stable toolchain this
//! crate is built and tested with; raising it is not a breaking change but
//! is noted in the changelog.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
pub mod body;
mod budget;
mod decide;
pub mod error;
pub mod future;
pub mod hedge;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics_off;
#[cfg(not(feature = "metrics"))]
use metrics_off as metrics;
mod outcome;
pub mod policy;
mod service;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;
mod sync;

use http::HeaderName;

pub use backoff::Backoff;
pub use body::{Buffered, CloneBody};
pub use budget::{
    BudgetChangeError, Counters, RetryBudget, DEFAULT_FLEET_FLOOR, DEFAULT_MIN_PER_SEC,
    DEFAULT_RATIO, DEFAULT_WINDOW,
};
pub use hedge::{Hedge, HedgeLayer};
pub use layer::{
    MaxAttempts, RetryLayer, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_SERVER_DELAY, DEFAULT_MIN_REMAINING,
};
pub use outcome::{GaveUp, StopReason};
pub use policy::{Class, Classify, DefaultPolicy, Policy};
pub use service::Retry;
pub use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken};
pub use tower_resilience_base::random::{ProcessRandom, RandomSource, SeededRandom};

/// The boxed error type of [`Retry`], as in tower (the toolkit's one
/// definition, from `tower-resilience-base`).
pub use tower_resilience_base::BoxError;

/// The "do not retry" signal: `x-tower-no-retry: 1` (the toolkit's one
/// definition, from `tower-resilience-base`).
///
/// Set on a failed response by this layer when a limit ended its retries,
/// and by the toolkit's bulkhead and breaker on their `503` answers. A
/// [`Retry`] that receives a response carrying it never retries that
/// response, and passes it on with the header, so no tier above retries it
/// either; strip it at the edge
/// (`tower_resilience_base::answer::strip_no_retry`).
///
/// # Example
///
/// ```
/// use tower_retry_budget::NO_RETRY_HEADER;
///
/// let response = http::Response::builder()
///     .status(503)
///     .header(NO_RETRY_HEADER, "1")
///     .body(())
///     .unwrap();
/// assert_eq!(response.headers()["x-tower-no-retry"], "1");
/// ```
pub use tower_resilience_base::NO_RETRY_HEADER;

/// The attempt number on retries of plain HTTP requests: `x-retry-attempt`.
///
/// `2` on the first retry, `3` on the second, absent on first attempts.
/// Replace it with [`RetryLayer::attempt_header`].
pub const RETRY_ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-retry-attempt");

/// The number of earlier attempts on retries of gRPC requests:
/// `grpc-previous-rpc-attempts` (`1` on the first retry), as in gRPC's
/// retry design.
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
