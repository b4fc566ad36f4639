//! Fail-fast concurrency compartments (bulkheads) for tower services: a
//! slow dependency fills its own compartment and is refused in
//! microseconds, while calls to everything else go on untouched.
//!
//! # Example
//!
//! ```
//! use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_bulkhead::error::BulkheadFull;
//! use tower_bulkhead::BulkheadLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // A payments client that hangs until we say so.
//! let (recover, recovered) = tokio::sync::watch::channel(false);
//! let payments = service_fn(move |amount: u32| {
//!     let mut recovered = recovered.clone();
//!     async move {
//!         recovered.wait_for(|up| *up).await?;
//!         Ok::<_, BoxError>(amount)
//!     }
//! });
//!
//! let layer = BulkheadLayer::new("payments", 2);
//! let handle = layer.handle();
//! let mut client = ServiceBuilder::new().layer(layer).service(payments);
//!
//! // Two calls take the compartment's two slots and hang...
//! let first = tokio::spawn(client.ready().await?.call(10));
//! let second = tokio::spawn(client.ready().await?.call(20));
//! assert_eq!(handle.in_flight(), 2);
//!
//! // ...so the third is refused at once, without calling payments.
//! let err = client.ready().await?.call(30).await.unwrap_err();
//! assert!(err.is::<BulkheadFull>());
//! assert_eq!(handle.rejected(), 1);
//!
//! recover.send(true)?;
//! assert_eq!(first.await??, 10);
//! assert_eq!(second.await??, 20);
//! assert_eq!(handle.in_flight(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! A *compartment* is a concurrency limit: a counter of calls in flight and
//! a maximum. In `call`, the bulkhead takes a slot of the request's
//! compartment with one compare-and-swap; if none is free, the call is
//! refused at once (or after a bounded wait, see `max_wait`). The slot is
//! held by the response future and given back when it completes, fails or
//! is dropped, so cancellation never leaks a slot. By default nothing is
//! queued.
//!
//! **Bounded wait.** With [`max_wait`](BulkheadLayer::max_wait), a call
//! that finds its compartment full may wait for a slot, bounded both in
//! time and in number: in `call` it takes one of the compartment's
//! [`max_waiters`](BulkheadLayer::max_waiters) waiter places (by default as
//! many as the limit) with one more compare-and-swap, then waits in its
//! response future for up to `max_wait`; waiters are woken in order, one
//! per freed slot. A call that finds the compartment full *and* every
//! waiter place taken is refused at once, exactly as without `max_wait`
//! ([`waited`](error::BulkheadFull::waited) is zero). A waiter gives its
//! place back when it gets a slot, times out, or its future is dropped.
//! So a compartment of limit `L` holds at most `L` calls in flight plus
//! `max_waiters` waiting, each waiter with its request and a clone of the
//! inner service, however large the burst.
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`new(name, limit)`](BulkheadLayer::new) | required (or `adaptive`) | the compartment's name (in errors, logs, handles) and its limit; `0` refuses everything |
//! | [`adaptive(name, algorithm)`](BulkheadLayer::adaptive) | instead of `new` | the limit follows the dependency: [`Aimd`](adaptive::Aimd) (20 initially, `[1, 1000]`) or [`Gradient`](adaptive::Gradient) (20 initially, `[3, 1000]`), or your [`LimitAlgorithm`](adaptive::LimitAlgorithm); see [`adaptive`] |
//! | [`criticality_shares`](BulkheadLayer::criticality_shares) | `[0.5, 0.75, 1.0, 1.0]` | the share of the limit each criticality (Sheddable, SheddablePlus, Critical, CriticalPlus) may use; past it, refused at once |
//! | [`without_criticality_shedding`](BulkheadLayer::without_criticality_shedding) | shedding on | every criticality may use the whole limit |
//! | [`max_wait`](BulkheadLayer::max_wait) | none | wait up to this long, in the response future, for a slot before refusing |
//! | [`max_waiters`](BulkheadLayer::max_waiters) | the compartment's limit | with `max_wait`: the most calls waiting per compartment at once; past it, refuse at once |
//! | [`per_key`](BulkheadLayer::per_key) | one compartment | a key function over the request; one compartment of `limit` per key |
//! | [`max_keys`](BulkheadLayer::max_keys) | [`DEFAULT_MAX_KEYS`] (1024) | bound on live keyed compartments |
//! | [`idle_timeout`](BulkheadLayer::idle_timeout) | [`DEFAULT_IDLE_TIMEOUT`] (60 s) | unused this long and not busy, a keyed compartment may be evicted |
//! | [`fallback_limit`](BulkheadLayer::fallback_limit) | the per-key limit | limit of the compartment shared by new keys past `max_keys` |
//! | [`retry_after`](HttpBulkheadLayer::retry_after) | [`DEFAULT_RETRY_AFTER`] (1 s) | HTTP mode: `Retry-After` of the 503, whole seconds rounded up |
//! | [`hold_until_body_end`](BulkheadLayer::hold_until_body_end) | off (the one-line stacks of `tower-breaker` turn it on) | HTTP responses (client or server flavour): keep the slot until the response body has been read to its end, has failed or has been dropped |
//!
//! There are two flavours with the same compartments:
//!
//! - [`Bulkhead`] (from [`BulkheadLayer`]), for clients: a refused call
//!   fails with [`BulkheadFull`](error::BulkheadFull) in a [`BoxError`].
//! - [`HttpBulkhead`] (from [`HttpBulkheadLayer`] or
//!   [`BulkheadLayer::http`]), for servers: a refused request is answered
//!   `503 Service Unavailable` with `Retry-After` and
//!   [`NO_RETRY_HEADER`] (`x-tower-no-retry: 1`), or, when its content type is
//!   `application/grpc...`, an HTTP 200 trailers-only response with
//!   `grpc-status: 8` (RESOURCE_EXHAUSTED), `grpc-message: bulkhead full`
//!   (and the no-retry mark). The inner error type passes through.
//!
//! **Keys.** With [`per_key`](BulkheadLayer::per_key), each key (a host, a
//! route, a tenant) gets its own compartment, so one saturated key leaves
//! the others untouched. At most `max_keys` compartments live at once;
//! compartments with nothing in flight that went unused for `idle_timeout`
//! are evicted, and past the bound new keys share one fallback compartment
//! (named `name/fallback`), so keys chosen by an attacker cannot grow
//! memory. See [`KeyedHandle`].
//!
//! **State.** The compartments are created by the layer's constructor and
//! shared by every clone of the layer and every service it wraps, however
//! many times `Layer::layer` is called (`axum::serve` may call it once per
//! connection): the limit is global to the layer value.
//!
//! **Adaptive limits.** With [`BulkheadLayer::adaptive`], the limit is not
//! a number chosen in advance: an algorithm moves it from the latency of
//! the calls and from congestion signals (calls dropped by their callers,
//! deadlines exceeded, timeouts, 503/504 answers), once per window of
//! calls, and the compartment refuses exactly as a fixed one does, against
//! the limit of the moment. A fixed compartment pays nothing for this;
//! an adaptive one times one call in sixteen and adds up its samples in
//! atomics. The algorithms, the signals and their defaults, which need no
//! tuning for dependencies of 1 ms to 1 s, are in the [`adaptive`] module.
//!
//! **Observability.** [`BulkheadLayer::handle`] gives a
//! [`CompartmentHandle`] (or a [`KeyedHandle`] for keyed bulkheads) with the
//! calls in flight, the calls waiting and the calls refused per compartment
//! (see [`Stats`]). Each refusal is
//! also a `WARN` event of [`tracing`](https://docs.rs/tracing) with the
//! compartment's name, at most one per compartment per second; the next
//! event reports how many were `suppressed` in between.
//!
//! # Criticality
//!
//! A request carries one of the four criticalities of
//! [`Criticality`](tower_resilience_base::criticality::Criticality)
//! (Sheddable < SheddablePlus < Critical, the default, < CriticalPlus).
//! As a compartment fills, the lowest are refused first: a request of
//! criticality `c` takes a slot only while fewer than `share(c) * limit`
//! (rounded up) calls are in flight, with the shares of
//! [`criticality_shares`](BulkheadLayer::criticality_shares) (default
//! Sheddable 0.5, SheddablePlus 0.75, Critical and CriticalPlus 1.0). So
//! at 60% of its limit a compartment refuses sheddable requests and still
//! admits critical ones, which keep the last slots to themselves. A
//! request shed this way fails at once with
//! [`BulkheadFull`](error::BulkheadFull) (503 in the HTTP flavour, never
//! after a wait), is logged with its criticality, and is counted in
//! [`Stats::shed`] (and in [`Stats::rejected`]). The same shares apply to
//! fixed and adaptive limits; turn them off with
//! [`without_criticality_shedding`](BulkheadLayer::without_criticality_shedding).
//!
//! The criticality is looked up only when the compartment is past the
//! lowest share (past half of it, by default), so most calls never pay for
//! it. Where it is read from depends on what the bulkhead can know about
//! the request, with no specialization:
//!
//! - [`HttpBulkhead`], and [`Bulkhead`] in body mode
//!   ([`hold_until_body_end`](BulkheadLayer::hold_until_body_end), so for
//!   `http::Request`s, as `tower_shield`'s client stack builds it): the
//!   request's extension, then the task-local scope, then Critical
//!   (`Criticality::of`).
//! - [`Bulkhead`] in its default mode (any request type): the task-local
//!   scope (`Criticality::current`), then Critical. A handler served
//!   inside the server stack's scope passes its criticality on to every
//!   client call it makes. To use an `http::Request`'s extension with
//!   such a bulkhead, run `call` in its scope:
//!   `Criticality::of(&req).sync_scope(|| service.call(req))`.
//!
//! The scope is read in `call`, not when the response future is polled:
//! `Criticality::Sheddable.scope(service.call(req))` creates the call
//! *outside* the scope; write `scope(async { service.call(req).await })`.
//!
//! # Readiness
//!
//! The bulkhead *rejects*; it never waits for capacity in `poll_ready`.
//! `poll_ready` forwards the inner service's readiness only, and the slot is
//! taken in `call`. A slot reserved in `poll_ready` would be held by every
//! clone that was made ready but not yet called, and axum clones the
//! service for every request, which is a known source of stalls. The
//! optional bounded wait (`max_wait`) happens in the response future: the
//! service made ready for that call is kept by the future and called once a
//! slot is free, which is why the inner service must be `Clone`. The
//! number of such futures waiting at once is bounded by `max_waiters`.
//!
//! # Errors
//!
//! [`Bulkhead`]'s error is [`BoxError`]: the inner service's error as is, or
//! [`BulkheadFull`](error::BulkheadFull), which names the compartment, its
//! limit, and whether the call waited (zero when it was refused at once,
//! including when every waiter place was taken). Downcast it, even under other
//! layers that box errors again; see the [`error`] module. It means **local
//! overload, not a dependency failure**: circuit breakers must not count
//! it, retry layers must not retry it. [`HttpBulkhead`] adds no error.
//!
//! # Ordering
//!
//! On the client, put the bulkhead *below* the retry layer and *above* the
//! per-attempt timeout, so that it caps the attempts in flight to the
//! dependency:
//!
//! ```text
//! ClientDeadlineLayer  one budget for the logical call
//!   BreakerLayer       ignores BulkheadFull (not the dependency's fault)
//!     RetryLayer       does not retry BulkheadFull; sleeps hold no slot
//!       BulkheadLayer  caps attempts in flight; refuses when full
//!         timeout      frees the slot of a hung attempt
//!           transport
//! ```
//!
//! Contrast with the bulkhead *above* the retry layer:
//!
//! ```text
//! BulkheadLayer        caps logical calls...
//!   RetryLayer         ...each holding its slot through every backoff sleep
//!     transport        and every attempt
//! ```
//!
//! There, a slot stays taken while its call sleeps between attempts, so a
//! compartment of 10 can be full while nothing at all is in flight to the
//! dependency, and refusals begin exactly when the dependency recovers.
//! Without any timeout below it, a hung dependency keeps its slots forever:
//! the compartment then isolates it (that is its purpose), but never lets it
//! back in. On servers, put the deadline layer outside the bulkhead, so
//! that an expired request's future is dropped and its slot freed.
//!
//! Unlike `tower::limit::ConcurrencyLimit` (which makes callers wait in
//! `poll_ready`) plus `tower::load_shed::LoadShed` (which turns that wait
//! into an error), the bulkhead decides in `call`, works with services that
//! are cloned per request, partitions by key, and speaks HTTP.
//!
//! # Using with axum
//!
//! ```
//! use std::time::Duration;
//! use axum::{extract::Request, routing::get, Router};
//! use tower_bulkhead::HttpBulkheadLayer;
//!
//! // At most 64 requests per tenant at once; the rest get 503 at once.
//! let layer = HttpBulkheadLayer::new("tenants", 64)
//!     .per_key(|req: &Request| req.headers().get("x-tenant").cloned())
//!     .max_keys(10_000)
//!     .retry_after(Duration::from_secs(2));
//! let handle = layer.handle();
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(layer);
//! # let _ = (app, handle);
//! ```
//!
//! `Router::layer` needs no error handling: rejections are responses. Use
//! [`hold_until_body_end`](HttpBulkheadLayer::hold_until_body_end) when
//! handlers stream bodies from the dependency the compartment protects.
//!
//! # Why reject instead of queue, and why bound the waiters?
//!
//! When a dependency slows down, every call to it waits longer, and every
//! waiting call holds a task, a connection, memory, and its caller's time.
//! A queue in front of the slow dependency only moves that waiting: its
//! callers still wait (now in the queue), the queue grows at the arrival
//! rate minus the dependency's shrinking throughput, and every queued call
//! is likely to be answered after its caller has given up. Little's law
//! does the rest: in-flight work grows until something else runs out, and
//! then calls to *healthy* dependencies fail too. A bulkhead refuses the
//! excess in microseconds instead: the callers get a clear, cheap answer
//! they can act on (degrade, use a cache, fail the request), the dependency
//! gets no more load than it can take, and the rest of the process keeps
//! its resources.
//!
//! The optional `max_wait` absorbs short bursts, and it is bounded twice,
//! because a bound on time alone is not a bound on waiting work. Each
//! waiting call holds its request (headers, body), a clone of the inner
//! service (often a connection handle or a buffer sender), and its
//! caller's task. With only `max_wait`, a burst of `N` calls parks all `N`
//! for the whole wait: a thousand-fold spike holds a thousand requests in
//! memory, and when the slots free they go to calls whose callers may have
//! given up, while fresh calls behind them also wait. That is the
//! unbounded queue again, only with a timer. `max_waiters` caps it: at
//! most `limit + max_waiters` calls are inside the compartment's
//! bookkeeping at any instant, whatever the arrival rate, so the memory
//! and the worst-case latency of a full compartment are known in advance
//! (`max_waiters` calls each wait at most `max_wait`). The default, as many
//! waiters as slots, lets roughly one more "generation" of calls through
//! per slot turnover: enough to smooth a blip, too few to hide an outage.
//!
//! # Pitfalls
//!
//! - A compartment is per layer *value*: build the layer once and reuse it
//!   (clone it) for every stack that shares the dependency. Two layers built
//!   with the same name are two compartments.
//! - The setters that shape compartments (`per_key`, `max_keys`,
//!   `idle_timeout`, `fallback_limit`) create new ones: take handles after
//!   configuring.
//! - Without a timeout below it, a hung dependency keeps its slots.
//! - A large `max_waiters` with a long `max_wait` is a queue again: every
//!   waiter holds its request and a service clone for up to `max_wait`.
//!   Keep the product of the two (and the inner service's clone cost)
//!   small; waiters show up in [`Stats::waiting`].
//! - `max_wait` and `max_waiters` belong to the layer value, not to the
//!   compartment: two clones of a layer configured differently share the
//!   compartment but each applies its own bounds to its own calls.
//! - In [`Head`](release::Head) mode (the default) a streaming response
//!   body is no longer counted once its head is out, and a dependency whose
//!   bodies stall after the head never fills the compartment; use
//!   [`hold_until_body_end`](BulkheadLayer::hold_until_body_end) (clients)
//!   or [`hold_until_body_end`](HttpBulkheadLayer::hold_until_body_end)
//!   (servers). In that mode a caller that keeps a response without
//!   reading or dropping its body keeps the slot.
//! - Keyed compartments take a short lock and read the clock per call, and
//!   allocate if the key function does; prefer cheap keys.
//! - Evicting a keyed compartment forgets its counters (and, for an
//!   adaptive one, what it learnt).
//! - An adaptive limit learns from the calls it sees: put the bulkhead
//!   where it sees each attempt (below the retry layer) and above the
//!   timeout that cuts them, so that the cuts reach it as errors or drops.
//! - The criticality scope must surround `call` (see "Criticality").
//!
//! # Feature flags
//!
//! | feature | default | what |
//! |---|---|---|
//! | `metrics` | off | `metrics`: calls in flight and rejections per compartment through the [`metrics`](https://docs.rs/metrics) facade, labelled with the compartment's name; the full list of names is in `docs/metrics.md` at the repository's root |
//!
//! # Minimum supported Rust version
//!
//! The MSRV is the `rust-version` in `Cargo.toml`, the stable toolchain this
//! crate is built and tested with; raising it is not a breaking change but
//! is noted in the changelog.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
pub mod body;
mod compartment;
pub mod error;
pub mod future;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics_off;
#[cfg(not(feature = "metrics"))]
use metrics_off as metrics;
pub mod partition;
pub mod release;
mod service;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;
mod sync;

pub use compartment::{CompartmentHandle, SetLimitError, Stats};
pub use layer::{BulkheadLayer, HttpBulkheadLayer, DEFAULT_RETRY_AFTER};
pub use partition::{KeyedHandle, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_KEYS};
pub use service::{Bulkhead, HttpBulkhead};

/// The boxed error type of [`Bulkhead`], as in tower.
pub use tower_resilience_base::BoxError;

/// A compartment's name: a `&'static str` that rejections copy for free,
/// or a shared string (the toolkit's one definition, from
/// `tower-resilience-base`).
pub use tower_resilience_base::Name;

/// The header that tells an upstream retry layer not to retry this answer:
/// `x-tower-no-retry`, with the value `1` (the toolkit's one definition,
/// from `tower-resilience-base`). [`HttpBulkhead`] puts it on its 503 and
/// gRPC answers: the rejection is local overload, and retrying it would
/// only add load where there is too much already.
pub use tower_resilience_base::NO_RETRY_HEADER;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
