//! Hedged requests: when an idempotent request is slow, send one more
//! attempt and take the first good answer, within the retry budget.
//!
//! Retries deal with failures, hedges with slowness. When a request has not
//! answered after the 95th percentile of recent latencies (learned) or a
//! fixed delay, [`Hedge`] sends the same request again through the same
//! inner service (a balancer below picks another replica); the first answer
//! that is not a retryable failure wins and the other attempts are dropped,
//! which cancels them. Only the slowest few percent of requests get a
//! hedge, so the extra load is small, while the tail shrinks: "The Tail at
//! Scale" (Dean and Barroso, 2013) reports a p99.9 falling from 1,800 ms to
//! 74 ms with 2% more requests.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::body::ReplayBody;
//! use tower_retry_budget::hedge::HedgeLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // A dependency whose first call is stuck on a slow replica.
//! let calls = Arc::new(AtomicUsize::new(0));
//! let dependency = service_fn({
//!     let calls = calls.clone();
//!     move |_req: http::Request<ReplayBody<String>>| {
//!         let n = calls.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             let took = if n == 0 { 500 } else { 5 };
//!             tokio::time::sleep(Duration::from_millis(took)).await;
//!             Ok::<_, BoxError>(http::Response::new(format!("replica {n}")))
//!         }
//!     }
//! });
//!
//! let layer = HedgeLayer::new().fixed_delay(Duration::from_millis(20));
//! let client = ServiceBuilder::new().layer(layer.clone()).service(dependency);
//!
//! let started = tokio::time::Instant::now();
//! let response = client.oneshot(http::Request::new(String::new())).await?;
//! assert_eq!(response.into_body(), "replica 1");
//! assert_eq!(started.elapsed(), Duration::from_millis(25), "20 ms delay + 5 ms");
//! assert_eq!((layer.counters().hedges, layer.counters().hedges_won), (1, 1));
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! For each request, [`Hedge`] decides whether it may be hedged: the
//! [`Policy`](crate::Policy) must say it may be sent twice
//! ([`is_retryable_request`](crate::Policy::is_retryable_request): `GET`,
//! `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`, or an `Idempotency-Key`),
//! hedging must be on, and its body must be replayable (see
//! [`body`](crate::body)); any other request passes through untouched. A
//! hedgeable request is sent at once. If it has not answered after the
//! delay, a hedge is sent, unless one of these says no, checked in this
//! order (the first "no" ends the call's hedging):
//!
//! 1. **Hedges left:** at most [`max_hedges`](HedgeLayer::max_hedges) per
//!    request (default 1); each further one a delay after the previous.
//! 2. **Pushback:** no answer of this call pushed back, and no answer of
//!    any call of the layer asked to wait that is still waiting: a
//!    `Retry-After`, a `grpc-retry-pushback-ms` (a delay pauses hedging
//!    for the whole layer that long, at most 10 s; a negative one, like the
//!    do-not-retry mark [`NO_RETRY_HEADER`](crate::NO_RETRY_HEADER), stops
//!    it for the call), or a local rejection below (a full bulkhead, an
//!    open circuit, retries spent by a retry layer below).
//! 3. **Deadline:** at least [`min_remaining`](HedgeLayer::min_remaining)
//!    of the call's deadline is left (the deadline of a `ClientDeadline`
//!    above, of the request's extensions or of the request being served,
//!    as for retries).
//! 4. **The breaker:** the attempt hook of a breaker above agrees
//!    (`check`): a circuit that is not closed stops hedging, before any
//!    budget is spent.
//! 5. **Readiness:** the inner service (a clone kept for the hedges) is
//!    ready; the call waits for it while its attempts run.
//! 6. **Budget:** the [`RetryBudget`](crate::RetryBudget) has room: hedges
//!    are charged to the same budget as retries.
//! 7. **Admission:** the hook admits the hedge (`admit`), which counts it.
//!
//! The first answer that is not a *retryable failure* wins: a success, or a
//! failure the [`Policy`](crate::Policy) does not retry (a `404`, an error
//! that is not transient). A retryable failure (a `503`, a reset
//! connection, a local rejection) never wins while another attempt is in
//! flight; when every attempt has failed, the first attempt's failure is
//! returned (or the earliest hedge's). Unlike tower's `Hedge`, a fast error
//! of one replica does not beat a slow success of another.
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`percentile`](HedgeLayer::percentile) | 0.95 | hedge after this percentile of recent latencies |
//! | [`fixed_delay`](HedgeLayer::fixed_delay) | none | hedge after this delay instead (nothing learned) |
//! | [`min_delay`](HedgeLayer::min_delay), [`max_delay`](HedgeLayer::max_delay) | 1 ms, 1 s | clamp of the learned delay |
//! | [`min_samples`](HedgeLayer::min_samples) | 100 | latencies needed before the estimate is used |
//! | [`fallback_delay`](HedgeLayer::fallback_delay) | none | delay until then (none: no hedge) |
//! | [`window`](HedgeLayer::window) | 10 s | each of the two rotating windows of the estimate |
//! | [`max_hedges`](HedgeLayer::max_hedges) | 1 | hedges per request (0 turns hedging off) |
//! | [`min_remaining`](HedgeLayer::min_remaining) | 10 ms | least deadline slice for a hedge |
//! | [`budget`](HedgeLayer::budget) | a new [`RetryBudget`](crate::RetryBudget) | shared by every service of the layer; [`HedgeLayer::above`] shares a retry layer's |
//! | [`policy`](HedgeLayer::policy) | [`DefaultPolicy`](crate::DefaultPolicy) | what may be hedged, what is a retryable failure |
//! | [`body_limit`](HedgeLayer::body_limit) | 64 KiB | most request body bytes buffered for replay |
//! | [`clone_bodies`](HedgeLayer::clone_bodies) | off | replay `Clone` bodies by cloning instead |
//! | [`attempt_header`](HedgeLayer::attempt_header) | [`HEDGE_ATTEMPT_HEADER`] | attempt number on HTTP hedges |
//!
//! **The estimate.** Every attempt that answers and wins adds its latency;
//! every attempt cancelled in flight (a race's loser, an attempt of a call
//! the caller dropped) adds its elapsed time as a lower bound: it took *at
//! least* that long. Dropping the losers (tower's `Hedge` records completed
//! attempts only) loses exactly the slow attempts that hedges beat, so the
//! percentile drifts low and the hedges grow; counting them as if they had
//! answered puts them just above the delay, so a delay that started too
//! low (the first latencies known are the fast ones: the slow ones are
//! still in flight) creeps back up by one hedge latency per refresh. The
//! percentile is read from the product-limit (Kaplan-Meier) estimate of the
//! latency distribution, which hands a cancelled attempt's weight to the
//! latencies beyond its elapsed time; when no answer beyond is known, the
//! delay is [`max_delay`](HedgeLayer::max_delay) until answers come. Where
//! latencies cluster (2 ms and 200 ms), the percentile falls between two
//! clusters, and the delay is taken on the side whose share of attempts
//! still running (the share that gets hedged) is nearer `1 - percentile`.
//! Latencies go to two windows of [`window`](HedgeLayer::window) each,
//! rotated by time, as log-scale buckets (16 per power of two, so the
//! delay is a bucket bound at most 6.25% off); recording one is a relaxed
//! atomic add, and the percentile is recomputed at most every
//! `window / 50` (at most 100 ms) and cached. Until
//! [`min_samples`](HedgeLayer::min_samples) latencies are known, the
//! [`fallback_delay`](HedgeLayer::fallback_delay) applies, or no hedge is
//! sent.
//!
//! **Hedges say so on the wire.** Every hedge carries its attempt number:
//! `grpc-previous-rpc-attempts` on gRPC requests, [`HEDGE_ATTEMPT_HEADER`]
//! (`x-hedge-attempt`, 2 for the first hedge) on others.
//!
//! **Observability.** A `tracing` event at `DEBUG` for every hedge sent
//! (`attempt`, `delay_ms`), every hedge that wins, every hedge refused
//! (`reason`: retry budget, attempt hook, deadline, pushback) and every
//! pause on a server's pushback; counters of requests, hedges, wins,
//! refusals by cause and cancelled attempts from
//! [`HedgeLayer::counters`] and [`Hedge::counters`]; the current delay
//! from [`HedgeLayer::current_delay`].
//!
//! # The budget: one per dependency
//!
//! Unbudgeted hedges are a retry storm: when every replica is slow (the
//! dependency is saturated), every request waits past the percentile and
//! gets a hedge, doubling the load of a dependency that already cannot
//! keep up. (gRPC's hedging throttle counts only failures, so pure
//! slowness can take the load to 4 or 5 times.) Here every hedge is
//! charged to a [`RetryBudget`](crate::RetryBudget): 10% of the requests by
//! default, shared with the retries of the same dependency. Built with
//! [`HedgeLayer::above`], the hedge layer shares the budget of the retry
//! layer below it, and hedges *plus* retries stay within the share of the
//! callers' requests: the retry layer counts every attempt it receives as a
//! request, hedges included, so each hedge is charged a little more (one
//! extra token every `1 / ratio` hedges) to take back what its own count
//! added. A breaker above that opens (on slow calls or timeouts) stops the
//! hedges altogether.
//!
//! # The breaker hook
//!
//! When a breaker above offers its [`AttemptHook`](crate::AttemptHook) in
//! the call context, this layer takes it for hedgeable requests, asks it
//! before each hedge (`check`) and admits each hedge through it (`admit`),
//! so the breaker counts every hedge and a circuit that is not closed
//! refuses them. Each attempt (the first, each hedge) is sent with its own
//! admission on offer: a retry layer below takes it and reports that
//! attempt and its retries; without one, this layer reports the attempt
//! itself. A loser is dropped, which reports its admission as cancelled
//! (never as a failure), so a cancelled probe frees its half-open slot at
//! once.
//!
//! # Readiness
//!
//! `poll_ready` forwards the inner service's readiness, nothing else. The
//! response future polls its own clone of the inner service for readiness
//! before each hedge, while the attempts in flight keep running.
//!
//! # Errors
//!
//! The error type is [`BoxError`](crate::BoxError): the winning attempt's
//! error (a failure that is not retryable), or, when every attempt failed,
//! the first attempt's error, unchanged. This layer adds no error of its
//! own; downcast as for the layers below.
//!
//! # Ordering
//!
//! In the toolkit's client stack, outermost first:
//!
//! ```text
//! ClientDeadlineLayer  one budget for the whole logical call (enforce_only)
//! BreakerLayer         fails fast while open; sees every attempt through the hook
//! HedgeLayer           this layer: one more attempt for a slow idempotent call
//! RetryLayer           backoff for each attempt's failures; the same budget
//! BulkheadLayer        a permit per attempt, hedges included
//! ClientDeadlineLayer  a fresh deadline header and cut-off for each attempt
//! transport
//! ```
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_bulkhead::BulkheadLayer;
//! use tower_deadline::ClientDeadlineLayer;
//! use tower_retry_budget::hedge::HedgeLayer;
//! use tower_retry_budget::RetryLayer;
//!
//! let retry = RetryLayer::new();
//! let stack = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(2)).enforce_only())
//!     // .layer(BreakerLayer::new(Breaker::new("inventory")))
//!     .layer(HedgeLayer::above(&retry))
//!     .layer(retry)
//!     .layer(BulkheadLayer::new("inventory", 32))
//!     .layer(ClientDeadlineLayer::new());
//! # let _ = stack;
//! ```
//!
//! Why there:
//!
//! - **Below the breaker, above the retry layer**, because the breaker
//!   hands its hook to the first layer below it that takes it. Taken here,
//!   the hook admits and counts every hedge, and each attempt's admission
//!   is handed on to the retry layer, which reports that attempt and its
//!   retries: the breaker sees everything the dependency sees. Below the
//!   retry layer, the hedges would be invisible to the breaker (the retry
//!   layer would have taken the hook), and a breaker that opened could not
//!   stop them.
//! - **Each attempt retries on its own.** A failed attempt is retried
//!   below with backoff while the other keeps running; hedging answers
//!   slowness, retrying failures. A retry's backoff counts as slowness: if
//!   the first attempt is backing off when the delay passes, the hedge
//!   goes out (charged to the same budget).
//! - **Above the bulkhead**, so each hedge takes its own permit (the cap on
//!   attempts in flight holds, hedges included) and a cancelled loser's
//!   dropped future gives its permit back at once; a full compartment
//!   rejects the hedge locally, which stops hedging for the call and is
//!   never counted by the breaker.
//! - **Below the whole-call deadline**, which bounds every attempt; a
//!   hedge is never sent with less than [`min_remaining`](HedgeLayer::min_remaining)
//!   left, and the per-attempt layer writes each attempt's own header.
//!
//! Contrast with two stacks that look reasonable:
//!
//! ```text
//! BreakerLayer       the retry layer takes the      HedgeLayer        the breaker sees each
//!   RetryLayer       hook: the breaker sees one       BreakerLayer    hedge as a call of its
//!     HedgeLayer     attempt per retry, never a         RetryLayer    own, but cannot be asked
//!       transport    hedge, and cannot stop them          transport   first: a hedge pays its
//!                                                                     budget token, then is
//!                                                                     refused
//! ```
//!
//! With buffered bodies, the retry layer below receives the hedge layer's
//! [`ReplayBody`](crate::body::ReplayBody) and buffers it again (cheaply:
//! its frames are `Bytes`); with `Clone` bodies (`Full<Bytes>`), use
//! [`clone_bodies`](HedgeLayer::clone_bodies) on the hedge layer, so the
//! transport keeps the body type of the retry layer's mode.
//!
//! # Why hedge, and why a percentile?
//!
//! A request's latency is the latency of the slowest thing it waits for.
//! A replica that pauses (a garbage collection, a noisy neighbour, a cold
//! cache) makes a few percent of requests a hundred times slower, and at
//! fan-out every user request meets one. Waiting for the slow attempt is
//! the only choice a retry layer has (it cannot tell slow from hung until
//! the timeout); a hedge asks another replica instead, after waiting as
//! long as most requests take: at the 95th percentile, about 5% of the
//! requests get a hedge (the extra load), and those are exactly the ones
//! stuck behind a slow replica. A percentile learned from the dependency's
//! own recent latencies follows it as it changes; a fixed delay is simpler
//! and right when the latency is well known.
//!
//! # Pitfalls
//!
//! - **Only idempotent requests.** A hedge is a second copy of the request
//!   while the first is still running: a non-idempotent request is never
//!   hedged unless it carries an `Idempotency-Key` the server honours.
//! - **Build the layer once.** It owns the estimate, the counters and (with
//!   [`HedgeLayer::new`]) the budget; a layer built per request learns
//!   nothing and never refuses anything.
//! - **Independent replicas.** A hedge through a single connection to a
//!   single server mostly doubles the load: put a balancer below.
//! - **A hedge supersedes the body of the attempt before it** (buffered
//!   bodies): if the first attempt was still sending its body when the
//!   hedge starts, it fails and the hedge carries on (the hook is told it
//!   was cancelled). `Clone` bodies ([`clone_bodies`](HedgeLayer::clone_bodies))
//!   do not have this limit.
//! - **Keep the chain synchronous**, as for the retry layer: a layer
//!   between the breaker and this one that calls its inner service later
//!   (tower's `Buffer`) hides the hook, and the breaker then counts each
//!   call once, not each hedge.

mod decide;
mod estimate;
pub mod future;
mod layer;
mod service;
mod shared;

pub use layer::{
    HedgeLayer, DEFAULT_HEDGE_WINDOW, DEFAULT_MAX_DELAY, DEFAULT_MAX_HEDGES, DEFAULT_MIN_DELAY,
    DEFAULT_MIN_SAMPLES, DEFAULT_PERCENTILE, HEDGE_ATTEMPT_HEADER,
};
pub use service::Hedge;
pub use shared::HedgeCounters;
