//! Client-side adaptive throttling: the Google SRE book's rule, as a layer.
//!
//! A breaker sheds everything or nothing. A throttle sheds *in proportion*:
//! when the dependency accepts fewer requests than this client sends, the
//! client rejects a share of its own requests locally, before they cost
//! the dependency anything, and keeps sending about K times what the
//! dependency accepts.
//!
//! # Example
//!
//! ```
//! use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
//! use tower_breaker::throttle::{Throttled, ThrottleLayer};
//! use tower_resilience_base::error::is_local_rejection;
//! use tower_resilience_base::random::SeededRandom;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let layer = ThrottleLayer::new("search").random(std::sync::Arc::new(SeededRandom::new(1)));
//! let throttle = layer.handle().clone();
//! // A dependency that is overloaded: it answers 503 to everything.
//! let client = ServiceBuilder::new().layer(layer).service(service_fn(|_req: http::Request<()>| async {
//!     let mut answer = http::Response::new(());
//!     *answer.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
//!     Ok::<_, BoxError>(answer)
//! }));
//! let mut throttled = 0;
//! for _ in 0..100 {
//!     match client.clone().oneshot(http::Request::new(())).await {
//!         Ok(_) => {}
//!         Err(e) => {
//!             assert!(e.is::<Throttled>() && is_local_rejection(&*e));
//!             throttled += 1;
//!         }
//!     }
//! }
//! // Nothing is accepted: after the first 10 requests, up to 90% are rejected.
//! assert!(throttled > 60, "{throttled}");
//! assert_eq!(throttle.snapshot().rejected, throttled);
//! # }
//! ```
//!
//! # Semantics
//!
//! Over a sliding window, the throttle counts **requests** (every call that
//! reached it, those it rejected included, as the SRE book counts them)
//! and **accepts** (calls the dependency accepted, by the classifier). It
//! rejects each new request with probability
//!
//! ```text
//! p = max(0, (requests − K · accepts) / (requests + 1)),  at most max_rejection
//! ```
//!
//! While the dependency accepts everything, `requests − K · accepts` is
//! negative and nothing is rejected (not even a random draw is made).
//! When it accepts only so many requests a second (it is overloaded, or
//! refusing work with 429 or 503), the client settles where it sends about
//! K times what the dependency accepts: against a dependency that accepts
//! 20 of the 100 requests a second offered, with K = 2, about 40 a second
//! are sent and 60% are rejected locally. Against one that accepts a fixed
//! share `a` of what it is sent, the rejection share climbs to the cap
//! when `K · a < 1` and stays at zero when `K · a > 1`; at `K · a = 1`
//! exactly (half failing, K = 2) the rule is neutral and the window's
//! noise moves it.
//!
//! | setting | default | |
//! |---|---|---|
//! | [`window`](ThrottleConfig::window) | 120 s | the SRE book's two minutes; 60 buckets, no timer: the first call of a new bucket moves the window |
//! | [`k`](ThrottleConfig::k) | 2.0 | the SRE book's; at least 1.0 |
//! | [`criticality_k`](ThrottleConfig::criticality_k) | `Sheddable` 1.5, `SheddablePlus` 1.75, `Critical` 2.0, `CriticalPlus` 2.0 | derived from K: ¾ K, ⅞ K, K, K (at least 1) |
//! | [`max_rejection`](ThrottleConfig::max_rejection) | 0.9 | Envoy's admission control uses 0.8; see the setting for why 0.9 |
//! | [`min_requests`](ThrottleConfig::min_requests) | 10 | no rejection on fewer requests in the window |
//! | [`coarse_clock`](ThrottleConfig::coarse_clock) | off | tokio's clock (paused in tests); on, a millisecond clock that is cheaper to read and does not follow tokio's paused clock |
//!
//! What counts:
//!
//! - An **accept** is a call whose outcome the classifier calls a
//!   [`Success`](crate::Outcome::Success). The default for HTTP, the
//!   [`ThrottleClassifier`], is the breaker's classification except that
//!   `429` and gRPC `RESOURCE_EXHAUSTED` (the dependency refusing work) are
//!   not accepts. HTTP responses are judged at their head.
//! - A call that fails, or that the caller drops before it completes (its
//!   deadline passed: congestion, not nothing), is a request that was not
//!   accepted.
//! - A call **in flight** counts as accepted until it fails, is cut or is
//!   dropped: it has not been refused. (Counted as not accepted until it
//!   ends, a throttle starting in front of a healthy dependency of 1 s
//!   answers would reject 90% of its first second's calls: every one of
//!   them a request without an accept yet.)
//! - A **local rejection from below** (a full bulkhead, an open circuit,
//!   another throttle: [`is_local_rejection`](tower_resilience_base::error::is_local_rejection),
//!   or an HTTP answer such a layer built) is taken back: neither a
//!   request nor an accept, since it never reached the dependency.
//! - A call this throttle rejects stays a request, refused.
//!
//! The counts are kept in rings of 60 time buckets of atomics (eight
//! words a bucket: requests and refusals of each criticality, each word
//! stamped with its bucket's epoch; accepts are requests less refusals),
//! one ring per thread stripe so that threads never write the same cache
//! line. A call makes one clock reading (or takes the one a layer above
//! made for it; with [`ThrottleConfig::coarse_clock`], an atomic load of
//! the coarse clock instead, about 20 ns less a call on a virtual machine,
//! which the two-second buckets do not notice) and one atomic add for its
//! request on its own stripe; a
//! call that succeeds writes nothing more. While the refusals since the
//! newest bucket began are within a budget set from the past buckets (how
//! many the rule can take before it rejects anything), that is all; past
//! it, the call reads the window's totals from a cache of the past
//! buckets that the first call of each bucket recomputes (plus its own
//! stripe's newest bucket: within one bucket, a sixtieth of the window, a
//! thread does not yet see the other threads' calls). It draws a random
//! number only while some criticality is throttled. No lock, no allocation, no timer task;
//! [`ThrottleHandle::snapshot`] reads every stripe and is exact.
//!
//! # Criticality
//!
//! Requests are counted per [`Criticality`], and each criticality has its
//! own K and its own rule: **criticality `c` is rejected with the rule
//! applied to the requests and accepts of `c` and every criticality above
//! it, with `c`'s K, and never with a higher probability than a less
//! critical one.** Less critical requests get a smaller K (by default
//! `Sheddable` 1.5, `SheddablePlus` 1.75, `Critical` and `CriticalPlus`
//! K = 2), so they are rejected earlier and more often; the SRE book sheds
//! the lowest criticality first. Against a dependency that fails a steady
//! share `f` of its requests, a K rejects once `f > 1 − 1/K` (33%, 43% and
//! 50% failures); against one of fixed capacity, the requests of a
//! criticality and those above it are sent at most K times as often as
//! they are accepted.
//!
//! Why counts "from `c` up": `Sheddable` requests are judged on all the
//! evidence (the failures of critical calls too), while the requests the
//! throttle rejects at a low criticality, which count as requests without
//! accepts, never raise the rejection of a higher one. With one shared
//! count, a dependency that fails half of its requests would let the
//! sheddable rejections drag `Critical` (K = 2, on the rule's edge there)
//! up to the cap. Measured with the four criticalities mixed evenly
//! (`tests/throttle.rs`): with 40% of the calls failing, `Sheddable` 11%
//! rejected and the others none; with 50% (`Critical`'s edge), 40%, 24%,
//! 11% and 8% from `Sheddable` to `CriticalPlus`.
//!
//! `CriticalPlus` is never throttled beyond `Critical`'s rule: its
//! probability is at most `Critical`'s, and its K at least `Critical`'s (a
//! higher one is allowed).
//!
//! [`Throttle`] (for `http::Request`s) reads [`Criticality::of`] (the
//! request's extension, else the one in scope), [`PlainThrottle`] (any
//! request type) reads [`Criticality::current`] (the one in scope); both
//! default to `Critical`. Two flavours rather than one generic service: a
//! service cannot ask "is the request HTTP?" without specialization, so,
//! as for the breaker's flavours, each request family has its type.
//!
//! # Errors
//!
//! A rejected call fails at once, without calling the inner service, with
//! [`Throttled`] (the throttle's name and the probability applied) in a
//! [`BoxError`](crate::BoxError): a local rejection for
//! [`is_local_rejection`](tower_resilience_base::error::is_local_rejection),
//! so a breaker does not count it, a retry layer does not retry it, and
//! [`Answer::for_error`](tower_resilience_base::Answer::for_error) answers
//! 503 (gRPC UNAVAILABLE) with the do-not-retry mark. The inner service's
//! errors pass through boxed, unchanged.
//!
//! # Ordering
//!
//! **Inside the retry layer, just above the bulkhead**, so it sees every
//! attempt, as the dependency does:
//!
//! ```text
//! ClientDeadline → Breaker → Retry → Throttle → Bulkhead → ClientDeadline (per attempt) → transport
//! ```
//!
//! - The rule is about what the dependency is asked and accepts. Outside
//!   the retry layer, a request that succeeds on its third attempt would
//!   count as one request accepted, and the two refusals before it would
//!   be invisible; inside, the throttle counts three requests and one
//!   accept, and holds the attempts sent (retries included) near K times
//!   the accepts.
//! - A retry the throttle rejects is not retried again ([`Throttled`] is a
//!   local rejection): the retry layer stops and returns it. The breaker
//!   above, which counts attempts through its hook, ignores it.
//! - Above the bulkhead, so a full bulkhead's refusal is taken back (it
//!   never reached the dependency) and a rejected request never takes a
//!   permit.
//!
//! Outside everything (above the breaker), the throttle would count each
//! logical call once, which suits callers that do not retry; with a retry
//! layer below it, it sees only final outcomes and throttles later.
//!
//! # Why a throttle?
//!
//! An overloaded dependency still pays for every request it refuses
//! (reading it, deciding, answering): the SRE book reports a backend
//! spending a large share of its capacity just rejecting. A breaker does
//! not help, since an overloaded dependency still accepts most of its
//! capacity and never looks failed enough to open; a fixed rate limit is
//! wrong as soon as capacity changes. The throttle needs no setting for the
//! dependency's capacity: it follows what the dependency accepts.
//!
//! # Pitfalls
//!
//! - Build one throttle per dependency and share it ([`ThrottleHandle`] is
//!   shared by every service the layer builds); a throttle built per
//!   request never sees more than one.
//! - A dependency that answers 429 by design (quota) is throttled against
//!   too; give the throttle the breaker's [`DefaultClassifier`](crate::DefaultClassifier)
//!   if 429 should count as accepted.
//! - Changes are as slow as the window: after an outage at the cap, a
//!   recovered dependency gets its full traffic back over about two
//!   windows (four minutes by default; measured with a 6 s window: 65%
//!   still rejected after one window, none after two). The cap keeps at
//!   least 10% of the requests going meanwhile, which is how the throttle
//!   sees the recovery. A shorter window reacts faster and on less
//!   evidence.
//! - The layer's setters build a new throttle each: take
//!   [`ThrottleLayer::handle`] after the last one.

mod classify;
mod config;
pub mod future;
mod handle;
mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics_off;
#[cfg(not(feature = "metrics"))]
use metrics_off as metrics;
mod service;
mod window;

pub use classify::ThrottleClassifier;
pub use config::{
    ThrottleConfig, ThrottleConfigError, DEFAULT_K, DEFAULT_MAX_REJECTION, DEFAULT_MIN_REQUESTS,
    DEFAULT_WINDOW, MAX_WINDOW, MIN_WINDOW,
};
pub use handle::{ThrottleHandle, ThrottlePermit, ThrottleSnapshot};
pub use layer::{PlainThrottleLayer, ThrottleLayer};
pub use service::{PlainThrottle, Throttle};
pub use tower_resilience_base::criticality::Criticality;
pub use tower_resilience_base::error::Throttled;
