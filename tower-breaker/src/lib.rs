//! A circuit breaker for tower services that counts every attempt and
//! probes with one call.
//!
//! When a dependency is down, callers get a cheap
//! [`CircuitOpen`](error::CircuitOpen) error in nanoseconds instead of a
//! wait of seconds; when it comes back, one probe, not the whole backlog,
//! tests it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::{Breaker, BreakerConfig, BreakerLayer, State};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // A dependency that is down.
//! let dependency = service_fn(|_req: http::Request<String>| async {
//!     let mut response = http::Response::new(String::new());
//!     *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
//!     Ok::<_, BoxError>(response)
//! });
//!
//! let breaker = Breaker::with_config(
//!     "inventory",
//!     BreakerConfig::new().count_window(20).minimum_calls(10),
//! );
//! let client = ServiceBuilder::new()
//!     .layer(BreakerLayer::new(breaker.clone()))
//!     .service(dependency);
//!
//! // Ten failures in a row: 100% of the window, past the minimum of 10.
//! for _ in 0..10 {
//!     let response = client.clone().oneshot(http::Request::new(String::new())).await?;
//!     assert_eq!(response.status(), 503);
//! }
//! assert_eq!(breaker.snapshot().state, State::Open);
//!
//! // Now calls fail at once, without reaching the dependency.
//! let err = client.clone().oneshot(http::Request::new(String::new())).await.unwrap_err();
//! let open = err.downcast_ref::<CircuitOpen>().unwrap();
//! assert_eq!(open.breaker(), "inventory");
//! assert!(open.retry_after() <= Duration::from_millis(5500));
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! ```text
//!            failure rate or slow-call rate >= threshold
//!            (after minimum_calls), or N failures in a row
//!   ┌────────┐ ────────────────────────────────────────────▶ ┌──────┐
//!   │ Closed │                                               │ Open │ ◀─┐
//!   └────────┘ ◀──────────┐                                  └──────┘   │
//!        ▲                │ successes_to_close               │          │ a probe fails or is slow,
//!        │ (fresh window, │ probe successes in a row         │ the open │ or a probe outlasts
//!        │  growth reset, │                                  │ period   │ max_half_open_wait
//!        │  optional      │         ┌───────────┐            │ is over  │ (period grows: x growth,
//!        │  ramp-up)      └──────── │ Half-open │ ◀──────────┘ (next    │  capped, jittered)
//!        │                          └───────────┘   call)      ─────────┘
//! ```
//!
//! - **Closed**: every call passes; its outcome goes into the window. A
//!   call is admitted with one atomic load. The window is *count based*
//!   (the last N outcomes, a lock-free ring of atomic slots with the counts
//!   aggregated in one word) or *time based* (the last N buckets of time,
//!   rolled over by compare-and-swap). When a failure or a slow success is
//!   recorded and the window holds at least `minimum_calls`, the circuit
//!   opens if the failure rate or the slow-call rate reaches its threshold
//!   (rates are compared exactly, in millionths). The rule is checked only
//!   when a bad outcome arrives, so successes can never open the circuit.
//! - **Open**: calls are rejected without calling the inner service, with
//!   a [`CircuitOpen`](error::CircuitOpen) saying how long until the probe.
//!   The period starts at `open_period`, is multiplied by `open_growth` on
//!   each re-open in a row, capped at `max_open_period`, and then carries
//!   ±`jitter` (at the cap too) so a fleet does not probe in lockstep.
//!   There is no timer and no background task: the first call after the
//!   period moves the circuit to half-open (until then the
//!   [snapshot](Breaker::snapshot) still says open, with a `retry_after` of
//!   zero).
//! - **Half-open**: at most `permitted_probes` calls are in flight at once;
//!   everyone else is rejected, with a `retry_after` of about when the
//!   probe should finish. A probe that fails (or is slow) re-opens with the
//!   longer period; `successes_to_close` successes in a row close with a
//!   fresh window and the growth reset. A probe whose future is dropped
//!   frees its slot. Each probe may take `max_half_open_wait` from its
//!   admission: when every slot is held and the latest probe has been out
//!   that long, the circuit re-opens, so it can never wedge; with no probe
//!   out, it waits for traffic as long as it takes.
//! - **Generations**: every transition bumps a generation number kept in
//!   the same atomic word as the state. A call remembers the generation it
//!   was admitted in, and its outcome is discarded if the circuit has moved
//!   on since (a slow call admitted before an opening cannot count against
//!   the window of a later closed period). Transitions are
//!   compare-and-swaps on that word, so exactly one caller makes each.
//! - **Manual modes** ([`Mode`], switched with [`Breaker::set_mode`]):
//!   forced open, forced closed (counts, never opens), disabled (no
//!   counting, always pass) and metrics only (the machine runs and emits
//!   its events, but never rejects).
//!
//! Every knob, on [`BreakerConfig`], and its default (chosen for a breaker
//! per HTTP dependency):
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | [`count_window`](BreakerConfig::count_window) / [`time_window`](BreakerConfig::time_window) | last 20 calls | what is judged |
//! | [`minimum_calls`](BreakerConfig::minimum_calls) | 10 | calls in the window before judging (capped at a count window's size) |
//! | [`failure_rate`](BreakerConfig::failure_rate) | 0.5 | open when failures / calls reaches it |
//! | [`slow_calls`](BreakerConfig::slow_calls) | off (rate 0.5 once on) | a success this slow counts as slow; open when slow / calls reaches the rate |
//! | [`slow_call_end`](BreakerConfig::slow_call_end) | [`CallEnd::Body`](config::CallEnd::Body) | where an HTTP call's duration ends: its body's end, or its head |
//! | [`consecutive_failures`](BreakerConfig::consecutive_failures) | off | also open after this many failures in a row |
//! | [`open_period`](BreakerConfig::open_period) | 5 s | first open period |
//! | [`open_growth`](BreakerConfig::open_growth) | x2 | growth per re-open in a row |
//! | [`max_open_period`](BreakerConfig::max_open_period) | 60 s | cap (before jitter) |
//! | [`jitter`](BreakerConfig::jitter) | ±10% | random share of each period |
//! | [`permitted_probes`](BreakerConfig::permitted_probes) | 1 | probes in flight at once |
//! | [`successes_to_close`](BreakerConfig::successes_to_close) | 1 | probe successes in a row that close |
//! | [`max_half_open_wait`](BreakerConfig::max_half_open_wait) | 30 s | re-open if a probe takes longer |
//! | [`ramp_up`](BreakerConfig::ramp_up) | off | after closing, admit a share of calls growing to 100% over this period |
//! | [`rejection_event_interval`](BreakerConfig::rejection_event_interval) | 1 s | least interval between `circuit_rejected` events |
//! | [`random`](BreakerConfig::random) | [`ProcessRandom`](random::ProcessRandom) | source of the jitter (tests inject [`SeededRandom`]) |
//! | [`listener`](BreakerConfig::listener) | none | told about every [`Transition`] |
//! | [`store`](BreakerConfig::store) / [`refresh_interval`](FleetConfig::refresh_interval) | none / 1 s | share the decision across processes ([`store`]; see [Shared state](#shared-state-redis)) |
//! | [`on_store_failure`](FleetConfig::on_store_failure) | fail open | what to do while the store fails ([`StoreFailureMode`](store::StoreFailureMode)) |
//! | [`coarse_clock`](BreakerConfig::coarse_clock) | off | tell time by a millisecond clock read with one atomic load (not for paused-time tests) |
//!
//! Why these defaults: 20 calls with a minimum of 10 is the "half of the
//! last 20 calls" rule of thumb, and 10 calls keep one unlucky pair of
//! errors from opening the circuit. 5 s is long enough for a dependency
//! under load to drain its queue, short enough that a blip costs users
//! little; doubling up to a minute keeps a dependency that recovers in
//! bursts from being hammered every 5 s. One probe is the point of the
//! pattern (the backlog must not be the test), and the 30 s half-open wait
//! is longer than any sane client timeout, so only a hung probe hits it.
//!
//! Timing details: open deadlines are kept in whole milliseconds (rounded
//! down), relative to a [`tokio::time::Instant`] taken when the breaker was
//! built, so paused test time applies. The closed path reads no clock,
//! unless the window is time based (one read per outcome) or slow-call
//! detection is on (two reads per call) or a store is configured (one read
//! per call, to see whether a refresh is due). With
//! [`coarse_clock`](BreakerConfig::coarse_clock) each of those reads is an
//! atomic load of a clock a background thread advances every millisecond
//! while it is read (it sleeps after 100 ms without a reading; its error is
//! documented there); it follows the real clock, not paused test time.
//!
//! HTTP calls end when their response body ends ([`body`]): the client and
//! server flavours settle a good head's outcome in the response body, so a
//! body that fails (or is cut by a deadline below) after the head counts as
//! a failure, `grpc-status` in the trailers counts as the classifier says,
//! a body dropped half read counts as its head said, and a half-open probe
//! lasts until its body ends. A head that fails is counted at once.
//!
//! Observability: `tracing` events `circuit_opened` (warn; with the
//! breaker's name, the cause, the rates, the window's counts and the open
//! period), `circuit_half_open` and `circuit_closed` (info),
//! `circuit_probe_given_back` (info: the fleet's elected prober had no call
//! to probe with and handed the probe back; half-open to open, but no
//! failure),
//! `circuit_mode_changed`, and `circuit_rejected` (warn, at most once per
//! `rejection_event_interval` per breaker, with the rejected total);
//! [`Breaker::snapshot`] for the state, the window's counts and rates and
//! the [`Totals`](snapshot::Totals) (successful, failed, slow, ignored, **rejected**, stale,
//! opened); a [`Listener`](snapshot::Listener) for alarms.
//!
//! # Flavours
//!
//! The same [`Breaker`] can guard three kinds of service. Each flavour is
//! its own type with its own layer; they differ only in what they accept
//! and how they say "open":
//!
//! | service (layer) | requests | when open | inner error | attempt hook |
//! |---|---|---|---|---|
//! | [`CircuitBreaker`] ([`BreakerLayer`]), for HTTP clients | `http::Request<B>` | `Err(`[`CircuitOpen`](error::CircuitOpen)`)` in a [`BoxError`] | boxed | yes |
//! | [`HttpCircuitBreaker`] ([`HttpBreakerLayer`]), for HTTP servers | `http::Request<B>`, responses with a `B: Default` body | `503` + `Retry-After` + `x-tower-no-retry: 1`, or a gRPC UNAVAILABLE | unchanged | no |
//! | [`PlainCircuitBreaker`] ([`PlainBreakerLayer`]), for anything else | any | `Err(`[`CircuitOpen`](error::CircuitOpen)`)` in a [`BoxError`] | boxed | no |
//! | [`TypedCircuitBreaker`] ([`TypedBreakerLayer`]), plain with an unboxed error | any | `Err(`[`BreakerError::Open`](error::BreakerError::Open)`)`, no allocation | [`BreakerError::Inner`](error::BreakerError::Inner) | no |
//!
//! - The **client** flavour counts every attempt of a retry layer below
//!   through its attempt hook (see [Ordering](#ordering)); its default
//!   classifier is the [`DefaultClassifier`].
//! - The **server** flavour turns a rejection into an answer, so the
//!   service keeps its inner error type and fits `axum::Router::layer`
//!   (see [Using with axum](#using-with-axum)). It counts each request
//!   once; the classifier judges inner errors too, and the
//!   [`DefaultClassifier`] ignores answers that a layer inside built when
//!   it refused the request (a full HTTP bulkhead's 503). Default
//!   classifier: [`DefaultClassifier`].
//! - The **plain** flavour takes any request type and counts each call
//!   once. Its responses need not be HTTP, so its default classifier is
//!   [`ErrorsOnly`](classify::ErrorsOnly) (responses succeed, errors fail).
//!   Its **typed** form ([`PlainBreakerLayer::typed`]) returns a
//!   [`BreakerError`](error::BreakerError) instead of a [`BoxError`], so a
//!   refusal allocates nothing; use it where refusals are frequent (a
//!   tight loop against a dependency that is down) or where the caller
//!   matches on the error.
//!
//! [`BreakerLayer::http_answers`] and [`BreakerLayer::plain`] turn a client
//! layer into the other two, keeping its breaker.
//!
//! Each flavour but the typed form has a keyed twin, one breaker per key
//! of the request (host, route, tenant) from a bounded [`BreakerRegistry`]:
//! [`KeyedCircuitBreaker`](keyed::KeyedCircuitBreaker) ([`KeyedBreakerLayer`]),
//! [`KeyedHttpCircuitBreaker`](keyed::KeyedHttpCircuitBreaker) ([`KeyedHttpBreakerLayer`](keyed::KeyedHttpBreakerLayer), per-route
//! breakers on an axum router) and [`KeyedPlainCircuitBreaker`](keyed::KeyedPlainCircuitBreaker)
//! ([`KeyedPlainBreakerLayer`](keyed::KeyedPlainBreakerLayer)).
//!
//! Why types, not a setting: what differs between the flavours is their
//! `Service` impl, which a runtime mode cannot change. The client flavour's
//! error is [`BoxError`] (it adds [`CircuitOpen`](error::CircuitOpen)); the
//! server flavour keeps the inner error type, which is what lets it sit on
//! an `axum::Router` (whose services must be `Infallible`), and needs a
//! `B: Default` body to build its 503; the plain flavour accepts any
//! request type, where the other two need `http::Request` to read the
//! gRPC content type and offer the attempt hook. One generic type with a
//! mode parameter would be these three under one name, with worse
//! compiler errors. The keyed twins own a registry and a key function
//! instead of one breaker, and pay a lookup per call that the plain types
//! do not; tower and tower-http name their variants the same way
//! (`ConcurrencyLimit` and `GlobalConcurrencyLimit`, `Timeout` and
//! `RequestBodyTimeout`).
//!
//! # Readiness
//!
//! Every flavour forwards the inner service's `poll_ready` and decides
//! in `call`: it is a "reject" design, like `tower::load_shed`. It never
//! returns `Pending` because the circuit is open, never holds anything
//! between `poll_ready` and `call`, and so works with axum, which clones
//! services per request and ignores backpressure.
//!
//! # Errors
//!
//! The error of [`CircuitBreaker`] and [`PlainCircuitBreaker`] is
//! [`BoxError`]: either the inner service's error, unchanged, or
//! [`error::CircuitOpen`], which names the breaker and says when it will
//! probe; downcast to tell them apart (see the [`error`] module).
//! [`HttpCircuitBreaker`] adds no error: open means `503 Service
//! Unavailable` with `Retry-After` (whole seconds until the probe, rounded
//! up) and `x-tower-no-retry: 1`, or for gRPC requests an HTTP 200
//! trailers-only answer with `grpc-status: 14` (UNAVAILABLE); the inner
//! error passes through.
//!
//! What counts as a failure is the [`Classify`] policy's call; the
//! [`DefaultClassifier`] counts transport errors, timeouts and `5xx` as
//! failures, `4xx` as successes (they describe the caller), and does not
//! count a `tower-bulkhead` rejection or another breaker's
//! [`CircuitOpen`](error::CircuitOpen) at all (the dependency was not
//! called). A call whose future is dropped (cancelled by the caller) is not
//! counted either.
//!
//! # Ordering
//!
//! Put the breaker **outside** the retry layer, and let it count every
//! attempt:
//!
//! ```text
//! ClientDeadlineLayer  one budget for the whole logical call (enforce_only)
//! BreakerLayer         fails fast while open; counts every attempt via the hook
//! RetryLayer           backoff, budget; asks the breaker before each retry
//! BulkheadLayer        caps attempts in flight; its rejections are not counted
//! ClientDeadlineLayer  per attempt: writes the budget left on the wire
//! transport
//! ```
//!
//! [`tower-shield`](https://docs.rs/tower-shield)'s `client_stack` builds
//! exactly this in one line.
//!
//! [`CircuitBreaker`] offers its attempt hook
//! (`tower_resilience_base::hook`, one per layer, no allocation per call)
//! in the call context while it calls the layers below (the other two
//! flavours do not). A
//! `tower_retry_budget::Retry` below takes it, reports each attempt's
//! outcome to it (so the breaker's window sees three failures when the
//! dependency saw three calls), asks it before each backoff and admits
//! each retry through it: once the circuit has opened, the retry loop stops
//! at once and returns the breaker's [`CircuitOpen`](error::CircuitOpen).
//! The breaker then does not count the final outcome again. Without a retry
//! layer below, nobody takes the hook and the breaker counts each call
//! once. The hook judges each attempt from its status and headers, so a
//! `map_response` between the breaker and the retry layer changes nothing.
//!
//! The two naive orders are both wrong:
//!
//! ```text
//! BreakerLayer           RetryLayer
//!   RetryLayer             BreakerLayer
//!     transport              transport
//! ```
//!
//! On the left without the hook, the breaker sees one failure where the
//! dependency saw three, and opens three times too late. On the right, the
//! retry layer keeps retrying calls the breaker rejects (and three tiers of
//! it multiply the load during recovery).
//!
//! ## Why count every attempt?
//!
//! Envoy's outlier detection and Finagle's failure accrual count every
//! request sent to a host, retries included: retries are load, and each
//! failed attempt is evidence. resilience4j warns against it, because a
//! breaker that counts retries opens sooner than the share of failed
//! *requests* would suggest. Both are true; what matters is that the
//! thresholds are read the right way. A breaker that only sees the outcome
//! of a whole retry loop, on the other hand, is simply wrong: it reports
//! one failure where the dependency took three calls.
//! This crate counts attempts, so the thresholds mean "share of attempts
//! that failed". With 3 attempts per request and a dependency that fails
//! each attempt with probability p, the window sees p, not p³: a 50%
//! threshold opens at 50% attempt failures, even though, thanks to the
//! retries, only about 12% of requests failed. Set thresholds for the
//! attempt failure rate you consider an outage, and remember that a count
//! window of 20 holds about 7 requests' worth of attempts during an outage.
//!
//! # Using with axum
//!
//! axum calls `Layer::layer` once per connection; the circuit lives in the
//! [`Breaker`], so every connection shares it.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tower_breaker::{Breaker, HttpBreakerLayer};
//!
//! let breaker = Breaker::new("app");
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(HttpBreakerLayer::new(breaker.clone()));
//! # let _ = app;
//! ```
//!
//! A breaker in front of a whole server protects it from itself (it opens
//! when handlers keep failing); a breaker per dependency, in the client
//! stack the handlers use, is usually what you want
//! ([`KeyedBreakerLayer`] gives one per host or route).
//!
//! # Fallbacks
//!
//! When a call fails or the circuit is open, the caller may still answer:
//! [`tower-degrade`](https://docs.rs/tower-degrade)'s `FallbackLayer`,
//! outermost in the stack, turns selected failures (this breaker's
//! [`CircuitOpen`](error::CircuitOpen) among them) into an answer from a
//! fixed value, a function, or the last good response for the same key,
//! marks and counts it, and can run the fallback on a share of healthy
//! calls to show it still works. Its guide says when not to use one.
//!
//! # Adaptive throttling
//!
//! Where the breaker sheds everything or nothing, the [`throttle`] module
//! sheds in proportion to what the dependency accepts: the Google SRE
//! book's client-side rule, `max(0, (requests − K · accepts) / (requests +
//! 1))` over a sliding window, as a layer ([`ThrottleLayer`]) with a
//! shared [`ThrottleHandle`]. Its rejections
//! ([`Throttled`](throttle::Throttled)) are local rejections, which this
//! breaker does not count and no retry layer retries; less critical
//! requests are shed first. Place it inside the retry layer, above the
//! bulkhead; see the module for why.
//!
//! # Shared state (Redis, DynamoDB)
//!
//! A breaker in each process's memory does little for a fleet of many
//! short-lived processes: each must burn its own failures before it stops
//! calling. With a [`Store`](store::Store) (`RedisStore`, from the crate
//! [`tower-breaker-redis`](https://docs.rs/tower-breaker-redis)), the
//! breakers of every process that share a Redis, a key prefix and a
//! breaker name act as one circuit:
//!
//! ```no_run
//! # async fn run(store: std::sync::Arc<dyn tower_breaker::store::Store>) -> Result<(), tower_breaker::BoxError> {
//! use tower_breaker::{Breaker, BreakerConfig};
//!
//! // `store`: `Arc::new(tower_breaker_redis::RedisStore::connect(
//! //     "redis://127.0.0.1:6379", RedisOptions::new()).await?)`, say.
//! let breaker = Breaker::try_with_config("payments", BreakerConfig::new().store(store))?;
//! breaker.refresh().await?; // know the fleet's circuit before serving
//! # Ok(())
//! # }
//! ```
//!
//! The algorithm, after AWS's guidance for serverless circuit breakers,
//! with the conditional writes its sample lacks:
//!
//! - **One record per circuit, "open until T"**, T on the Redis server's
//!   clock. The circuit is open only while T is in the future; the record's
//!   existence means nothing by itself (its time to live, some minutes
//!   after T, is cleanup only). Every decision is one Lua script, atomic on
//!   the server and reading its clock (`TIME`), so the processes' clocks
//!   never matter.
//! - **Opening is a conditional write**: only if there is no record or its
//!   T has passed. Concurrent trips from many processes never push T
//!   forward; they all adopt the first writer's T.
//! - **Half-open is an election**: when T has passed, exactly one caller
//!   fleet-wide wins by moving T forward one (longer) open period; the
//!   others keep failing fast until then, and past it while the winner's
//!   lease runs: a short one ([`probe_lease`](FleetConfig::probe_lease),
//!   2 s) that the winner renews every third of it while its probe runs
//!   ([`Store::renew_probe`](crate::store::Store::renew_probe)), so a
//!   prober that dies or freezes frees the fleet one lease later and a
//!   slow live one keeps it (up to `max_half_open_wait`; on a store that
//!   cannot renew, the lease is that whole wait). The call that
//!   finds T passed waits for the election it starts (in the services'
//!   `poll_ready`, a keyed service's future, or [`Breaker::acquire`]; one
//!   store round trip, at most
//!   the [`election_timeout`](FleetConfig::election_timeout), 500 ms) and,
//!   won, is the probe itself: a quiet process does not hold the fleet
//!   until its next call. Calls refused during the election are told to
//!   retry when it ends. While another process probes, the store says so
//!   ([`Decision::Probing`](crate::store::Decision::Probing), on reads and
//!   lost elections), and callers are told the time left of its lease (at
//!   least a refresh interval), not the fleet's new T, which is where the
//!   circuit re-opens to if the probe fails. ([`Breaker::try_acquire`]
//!   does not wait: there the winner's next call probes.) A winner that
//!   has no probe in flight at two renewals in a row (no call came, or the
//!   waiting caller gave up) gives the probe back
//!   ([`Store::release_probe`](crate::store::Store::release_probe), about
//!   1.3 s after the win with the default lease), so the next call
//!   anywhere in the fleet probes; it never holds the fleet for as long as
//!   it stays quiet. Its success marks
//!   the record closed, only if the record still holds its token; a record
//!   that vanished (a restart, a failover) is never taken for a close:
//!   processes that know the circuit open keep it open and write it again.
//!   Its failure re-opens (fenced by the same token) for the
//!   next period of the growing schedule (`open_growth`, capped at
//!   `max_open_period`, jittered by the prober), and the record counts the
//!   re-opens so the next prober, in any process, grows from there.
//! - **A fleet-wide window** ([`fleet_window`](FleetConfig::fleet_window),
//!   on by default): each breaker reports the outcomes it counted, batched,
//!   and the store keeps a time-bucketed window of the whole fleet's calls;
//!   its script opens the circuit for everyone when the fleet's rates cross
//!   the thresholds after the fleet-wide `minimum_calls`. Reports replace
//!   the periodic read while there is traffic, and come every
//!   [`flush_interval`](FleetConfig::flush_interval) (100 ms) while
//!   failures arrive. 20 processes calling a failing dependency once a
//!   second each open together after about 30 calls; each alone would not
//!   trip for ten seconds.
//! - **A per-process cache**: each breaker reads the record at most once
//!   per [`refresh_interval`](FleetConfig::refresh_interval) (default
//!   1 s), in a spawned task, and folds the answer into its state word, so
//!   the closed path stays lock-free and makes no network call (it reads
//!   the clock once, to see whether a read is due: one Redis command per
//!   breaker per interval, whatever the traffic). A local decision to open
//!   is written through at once. [`Breaker::refresh`] reads at once, for a
//!   process that has just started.
//! - **Failing store**: every Redis call is bounded (50 ms by default). A
//!   timeout, a connection error or an unreadable reply fails open by
//!   default: calls go through, local counting goes on, and
//!   [`Totals::store_errors`](snapshot::Totals::store_errors) and a `circuit_store_failed` warning say the
//!   store is failing; [`StoreFailureMode::FailClosed`](store::StoreFailureMode::FailClosed)
//!   rejects instead. Nothing panics; the connection reconnects by itself,
//!   and a local opening the store missed is written again, so sharing
//!   resumes when Redis is back.
//!
//! Trade-offs, chosen on purpose:
//!
//! - **Counting is batched.** No call pays a network round trip to count:
//!   each process judges its own window at once (a local trip opens the
//!   circuit for all), and the fleet's window hears of failures within a
//!   flush interval. A process that has not reported yet cannot be counted,
//!   and outcomes of a report that fails are lost.
//! - **The cache delays the news** by up to one refresh interval (plus a
//!   read's round trip): after a trip, the other processes keep calling the
//!   dependency for up to that long, and after a successful probe they keep
//!   rejecting for up to that long. Shorter intervals cost one read per
//!   interval per breaker.
//! - **A process that has not read yet knows nothing**: its first calls
//!   pass until its first read, unless it awaits [`Breaker::refresh`].
//! - **Fail open protects this process alone while Redis is down**, which
//!   can be exactly when a big incident is under way; fail closed turns a
//!   Redis outage into an outage of every dependency behind a breaker.
//!   Alarm on `store_errors` either way.
//!
//! **On DynamoDB** (`DynamoDbStore`, from the crate
//! [`tower-breaker-dynamodb`](https://docs.rs/tower-breaker-dynamodb),
//! the seeds' own design for serverless functions), the same record is one
//! item and every decision a consistent read followed by a write
//! conditioned on the version read, so one prober wins each election
//! whatever the clocks. DynamoDB has no server clock: T comes from the
//! writer's clock, the store tolerates a configured skew between processes
//! (1 s by default) on a prober's lease, and a process that has itself
//! watched an opening or a lease for its whole length treats it as over
//! whatever its clock says (only clock rates must agree). The table's TTL
//! is cleanup only; items past it read as missing. There are no pushes: a
//! breaker learns of another process's decision at its next read.
//!
//! **In a process that is frozen or stops after its calls** (an AWS Lambda
//! instance is frozen as soon as its handler returns; a job or a CLI
//! exits), the reports and writes that run beside the calls may not have
//! run: end the unit of work with [`Breaker::flush`] or
//! [`FleetConfig::flush`], or wrap the handler in [`FlushLayer`], which
//! flushes after each call (one report per invocation that called through
//! a breaker, measured at about 0.5 ms on a local Redis in a debug build;
//! nothing when nothing is pending). See [`flush`]. Store calls in flight
//! when a process is frozen are not timed out by the freeze
//! ([`store::within`]).
//!
//! # Why a circuit breaker?
//!
//! A dependency that fails rarely does damage by failing; it does damage by
//! making callers *wait*. Every doomed call holds a task, a connection and
//! a slot of concurrency until its timeout fires, and retries multiply the
//! waiting. Timeouts bound one call; the breaker bounds how many calls wait
//! at all once the dependency is clearly unhealthy, turns the wait into an
//! immediate, typed error the caller can answer with a fallback, and lets
//! the dependency recover without the backlog landing on it at once.
//!
//! # Pitfalls
//!
//! - Create the [`Breaker`] once and share it; a breaker built inside a
//!   per-request closure never sees more than one call.
//! - One breaker per dependency (or per host): a single global breaker
//!   turns an outage of one dependency into an outage of all.
//! - Thresholds are shares of *attempts* when a retry layer is below (see
//!   above); the `4xx` of a misbehaving caller never count.
//! - A [`Listener`](snapshot::Listener) runs on the thread of the call that made the
//!   transition: keep it short and never block in it.
//! - [`CircuitBreaker`] takes `http::Request<B>` only: on any other
//!   request type the compiler reports that `CircuitBreaker<S>` does not
//!   implement `Service<YourRequest>`. Use [`PlainCircuitBreaker`]
//!   ([`PlainBreakerLayer`]) for non-HTTP services (each call counted once,
//!   no attempt hook).
//! - The hook reaches a retry layer below through the call context, during
//!   `call`: a layer in between that calls its inner service later or on
//!   another task (tower's `Buffer`) cuts it, and each call is then counted
//!   once. Keep such layers outside the stack.
//! - The snapshot of an open circuit whose period is over still says open
//!   until the next call moves it (there is no background task).
//! - [`HttpCircuitBreaker`] judges the response head: a gRPC status sent
//!   in trailers after a body is not seen.
//!
//! # Feature flags
//!
//! | feature | default | what |
//! |---|---|---|
//! | `metrics` | off | `metrics`: calls, rejections, state, transitions, probes and store errors through the [`metrics`](https://docs.rs/metrics) facade, labelled with the breaker's name; the full list of names is in `docs/metrics.md` at the repository's root; and the throttle's requests, accepts, rejections and rejection probability (`throttle::metrics`) |
//!
//! The one-line stacks and the reqwest and tonic integrations are in
//! [`tower-shield`](https://docs.rs/tower-shield), which depends on this
//! crate and the other three layers.
//!
//! The breaker cooperates with the other layers (counting every attempt of
//! a retry layer below, ignoring local rejections) without any feature:
//! the vocabulary they share lives in `tower-resilience-base`.
//!
//! # Minimum supported Rust version
//!
//! The MSRV is the `rust-version` in `Cargo.toml`, the stable toolchain this
//! crate is built and tested with; raising it is not a breaking change but
//! is noted in the changelog.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod breaker;
pub mod classify;
pub mod config;
pub mod error;
pub mod flush;
pub mod future;
mod hook;
pub mod keyed;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics_off;
#[cfg(not(feature = "metrics"))]
use metrics_off as metrics;
mod service;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod settings;
pub mod snapshot;
mod state;
pub mod store;
mod sync;
pub mod throttle;
mod window;

pub use breaker::{Breaker, FleetRetries, Permit};
pub use classify::{Classify, DefaultClassifier, Outcome};
pub use config::{BreakerConfig, FleetConfig};
pub use flush::FlushLayer;
pub use keyed::{BreakerRegistry, KeyedBreakerLayer};
pub use layer::{BreakerLayer, HttpBreakerLayer, PlainBreakerLayer, TypedBreakerLayer};
pub use service::{CircuitBreaker, HttpCircuitBreaker, PlainCircuitBreaker, TypedCircuitBreaker};
pub use snapshot::{Snapshot, Transition};
pub use state::{Mode, State};
pub use throttle::{ThrottleHandle, ThrottleLayer};
pub use tower_resilience_base::random::SeededRandom;
/// The random sources of the open period's jitter and the probe
/// elections: [`SeededRandom`] for tests, [`ProcessRandom`](random::ProcessRandom)
/// by default, or a [`RandomSource`](random::RandomSource) of your own
/// (the toolkit's one definition, from `tower-resilience-base`).
pub mod random {
    pub use tower_resilience_base::random::{ProcessRandom, RandomSource, SeededRandom};
}
pub use tower_resilience_base::Answer;
/// A breaker's name: a `&'static str` that refusals copy for free, or a
/// shared string (the toolkit's one definition, from
/// `tower-resilience-base`).
pub use tower_resilience_base::Name;

/// The boxed error type of [`CircuitBreaker`] and [`PlainCircuitBreaker`], as
/// in tower (the toolkit's one definition, from `tower-resilience-base`).
pub use tower_resilience_base::BoxError;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
