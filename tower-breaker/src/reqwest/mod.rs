//! reqwest through the client stack, with reqwest-style code (feature
//! `reqwest`).
//!
//! The layers speak `http::Request` / `http::Response` (they read and write
//! headers and extensions, and the retry layer replays bodies), while
//! reqwest users write `client.get(url).send().await`. This module joins
//! the two:
//!
//! - [`ReqwestService`]: `reqwest::Client` as the transport at the bottom
//!   of a stack, for any request body (the retry layer's `ReplayBody`
//!   included), answering `http::Response<reqwest::Body>`.
//! - [`Client`]: `get`, `post`, `put`, `patch`, `delete`, `head` and
//!   `request`, then `header`, `bearer_auth`, `body`, `timeout` and
//!   `send`, which returns a `reqwest::Response` (`status()`, `text()`,
//!   `bytes()`, `error_for_status()` and `url()` work as usual).
//!   [`ClientStack::reqwest`](crate::stack::ClientStack::reqwest) builds
//!   one over the whole recommended stack in one call.
//! - `StackMiddleware` (feature `reqwest-middleware`): the same stack as
//!   one middleware of a `reqwest_middleware::ClientWithMiddleware`.
//!
//! reqwest comes without its default features: enable the TLS backend you
//! want (`reqwest/rustls-tls`, `reqwest/native-tls`) in your own
//! `Cargo.toml`; features unify.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::stack::client_stack;
//!
//! # async fn run() -> Result<(), tower_breaker::BoxError> {
//! let stack = client_stack("catalog")
//!     .timeout(Duration::from_secs(2))
//!     .concurrency(32);
//! let breaker = stack.breaker_handle().clone();
//! // Build it once per dependency; clones share the breaker and the budget.
//! let client = stack.reqwest(
//!     reqwest::Client::builder()
//!         .connect_timeout(Duration::from_millis(200))
//!         .build()?,
//! );
//!
//! let items = client.get("http://127.0.0.1:3000/items").send().await?.text().await?;
//! let order = client
//!     .post("http://127.0.0.1:3000/orders")
//!     .header("idempotency-key", "order-42") // a POST is retried only with one
//!     .header("content-type", "application/json")
//!     .body(r#"{"sku":"apples","quantity":3}"#)
//!     .timeout(Duration::from_millis(500)) // this call's budget, retries included
//!     .send()
//!     .await?;
//! println!("{items} / {}", order.status());
//!
//! match client.get("http://127.0.0.1:3000/items").send().await {
//!     Err(e) if e.is::<CircuitOpen>() => println!("catalog is down: {e}"),
//!     other => println!("{:?}", other.map(|r| r.status())),
//! }
//! println!("{:?}", breaker.snapshot().state);
//! # Ok(())
//! # }
//! ```
//!
//! The transport alone composes with any stack built by hand:
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_breaker::reqwest::{Client, ReqwestService};
//! use tower_breaker::{Breaker, BreakerLayer};
//! use tower_deadline::ClientDeadlineLayer;
//! use tower_retry_budget::RetryLayer;
//!
//! let stack = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(2)).enforce_only())
//!     .layer(BreakerLayer::new(Breaker::new("inventory")))
//!     .layer(RetryLayer::new())
//!     .layer(ClientDeadlineLayer::new())
//!     .service(ReqwestService::new(reqwest::Client::new()));
//! let client = Client::new(stack);
//! # let _ = client;
//! ```
//!
//! # Which to choose
//!
//! - **[`Client`]** when you own the call sites: it is the stack and
//!   nothing else, with no boxing of its own per call (only reqwest's),
//!   and per-call budgets through [`RequestBuilder::timeout`].
//! - **`StackMiddleware`** (feature `reqwest-middleware`) when your code already goes through a
//!   `reqwest_middleware::ClientWithMiddleware` (tracing, auth, caching
//!   middlewares). Put it *last* in the chain, so that only the transport
//!   and middlewares that must run on every attempt (auth signing, say)
//!   come after it, and do not add a retry middleware (`reqwest-retry`)
//!   anywhere: retries above the breaker are counted as separate calls
//!   and multiply with ours. It costs one boxed future per attempt (the
//!   chain's own) and rebuilds the stack's services per call (a few
//!   reference counts).
//!
//! Both count the same way: the breaker, the retry layer and the hook
//! between them sit inside one stack, so the breaker counts every attempt,
//! the retry layer replays the body it recorded while the first attempt
//! sent it (up to 64 KiB; a larger or endless body is sent once and never
//! retried), and each attempt carries the remaining budget in its
//! `x-request-timeout-ms` header.
//!
//! # Why not an existing adapter?
//!
//! `tower-reqwest` (`HttpClientLayer`) accepts only
//! `http::Request<reqwest::Body>`, so our retry layer's `ReplayBody` needs
//! a `map_request` to pass, and `tower-http-client` builds requests over
//! any `Service` but answers `http::Response`, not a `reqwest::Response`,
//! so neither keeps `client.get(url).send().await?.text().await?` as it
//! is. Both releases that are current require reqwest 0.13 and would put a
//! second reqwest in trees on 0.12, and both are the work of one
//! maintainer; their errors (plain `reqwest::Error`) would be fine. The
//! adapter that fits is about 150 lines with no dependency beyond reqwest
//! itself, so we ship and test our own.
//!
//! # Errors
//!
//! [`RequestBuilder::send`] returns a [`BoxError`](crate::BoxError): the
//! transport's `reqwest::Error` or a layer's typed error, which callers
//! downcast:
//!
//! ```
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::{Breaker, Mode};
//! use tower_breaker::stack::client_stack;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let breaker = Breaker::new("catalog");
//! breaker.set_mode(Mode::ForcedOpen);
//! let client = client_stack("catalog").breaker(breaker).reqwest(reqwest::Client::new());
//! // Rejected at once: nothing is sent, so no server is needed.
//! let err = client.get("http://127.0.0.1:9/items").send().await.unwrap_err();
//! assert!(err.is::<CircuitOpen>());
//! # }
//! ```
//!
//! # Pitfalls
//!
//! - Build the client once per dependency and clone it; a client built
//!   per request has a breaker that never sees more than one call.
//! - Leave `reqwest::ClientBuilder::timeout` unset: it bounds each
//!   attempt separately and is invisible to the breaker's slow-call
//!   counting; use the stack's `timeout` and [`RequestBuilder::timeout`].
//! - A `POST` or `PATCH` is retried only with an `Idempotency-Key` header.
//! - Responses of a [`Client`] come from reqwest's `From<http::Response>`;
//!   their `url()` is the real one (this module keeps it), but
//!   `remote_addr()` is `None`.

mod client;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
mod middleware;
mod service;

pub use client::{Client, HttpRequest, RequestBuilder};
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub use middleware::{downcast_error, StackMiddleware};
pub use service::{HttpResponse, ReqwestService, ResponseFuture};
