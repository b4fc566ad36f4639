//! reqwest through the client stack, with reqwest's own request builder
//! (feature `reqwest`, on reqwest 0.13).
//!
//! The layers speak `http::Request` / `http::Response` (they read and write
//! headers and extensions, and the retry layer replays bodies), while
//! reqwest users write `client.get(url).query(..).json(..).send().await`.
//! This module joins the two:
//!
//! - [`ReqwestService`]: `reqwest::Client` as the transport at the bottom
//!   of a stack, for any request body (the retry layer's `ReplayBody`
//!   included), answering `http::Response<reqwest::Body>`.
//!   [`ReqwestService::client_builder`] starts a `reqwest::Client` for it
//!   with reqwest's own retries off.
//! - [`Client`] and [`RequestBuilder`]: `get`, `post`, `put`, `patch`,
//!   `delete`, `head`, `request` and `execute`, and a builder that *is*
//!   reqwest's `reqwest::RequestBuilder`, wrapped: every method is
//!   delegated to it, so a request is built exactly as reqwest builds it,
//!   then sent through the stack by `send`, which returns a
//!   `reqwest::Response` (`status()`, `text()`, `bytes()`, `json()`,
//!   `error_for_status()` and `url()` work as usual).
//!   [`ClientStack::reqwest`](crate::stack::ClientStack::reqwest) builds
//!   one over the whole recommended stack in one call.
//! - `StackMiddleware` (feature `reqwest-middleware`): the same stack as
//!   one middleware of a `reqwest_middleware::ClientWithMiddleware`
//!   (reqwest-middleware 0.5).
//! - [`find_error`]: the typed error (a layer's, or one a response body
//!   yielded) anywhere in an error's `source()` chain.
//!
//! reqwest comes without its default features: enable the TLS backend you
//! want (`reqwest/rustls`, which brings rustls with the aws-lc-rs
//! provider in 0.13, `reqwest/rustls-no-provider` to install your own, or
//! `reqwest/native-tls`) in your own `Cargo.toml`; features unify.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_breaker::error::CircuitOpen;
//! use tower_shield::reqwest::ReqwestService;
//! use tower_shield::stack::client_stack;
//!
//! # async fn run() -> Result<(), tower_breaker::BoxError> {
//! let stack = client_stack("catalog")
//!     .timeout(Duration::from_secs(2))
//!     .concurrency(32);
//! let breaker = stack.breaker_handle().clone();
//! // Build it once per dependency; clones share the breaker and the budget.
//! let client = stack.reqwest(
//!     ReqwestService::client_builder() // reqwest's own retries off
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
//!     .timeout(Duration::from_millis(500)) // this call's budget, from send, retries included
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
//! use tower_shield::reqwest::{Client, ReqwestService};
//! use tower_breaker::{Breaker, BreakerLayer};
//! use tower_deadline::ClientDeadlineLayer;
//! use tower_retry_budget::RetryLayer;
//!
//! # fn main() -> Result<(), reqwest::Error> {
//! let stack = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(2)).enforce_only())
//!     .layer(BreakerLayer::new(Breaker::new("inventory")))
//!     .layer(RetryLayer::new())
//!     .layer(ClientDeadlineLayer::new())
//!     .service(ReqwestService::new(ReqwestService::client_builder().build()?));
//! // This crate's layers over a `ReqwestService`: `new` finds the
//! // `reqwest::Client` at the bottom. Any other stack: `Client::from_parts`.
//! let client = Client::new(stack);
//! # let _ = client;
//! # Ok(())
//! # }
//! ```
//!
//! # The builder is reqwest's
//!
//! [`RequestBuilder`] holds a `reqwest::RequestBuilder` and delegates to
//! it: `header` (appends), `headers` (merges a map, every value of a
//! multi-valued name kept), `basic_auth`, `bearer_auth`, `body`,
//! `timeout`, `version`, and, behind this crate's features that turn on
//! reqwest's, `query`, `form`, `json` and `multipart`; plus `try_clone`,
//! `build` and `build_split`. Anything else reqwest's builder offers is
//! one [`map_reqwest`](RequestBuilder::map_reqwest) away. `send` lets
//! reqwest finish the request (`RequestBuilder::build`), so the URL's
//! userinfo becomes `Authorization: Basic`, query strings and forms are
//! encoded and `Content-Type` is set exactly as reqwest does, then hands
//! the finished `reqwest::Request` to the stack as an `http::Request`
//! whose parsed URL rides along, so that no attempt parses it again.
//! (reqwest's `fetch_mode_no_cors` exists only in its WebAssembly client,
//! which this module does not cover.)
//!
//! | this crate's feature | reqwest's feature | builder method |
//! |---|---|---|
//! | `reqwest` | none | everything but the four below |
//! | `reqwest-query` | `query` | [`RequestBuilder::query`] |
//! | `reqwest-form` | `form` | [`RequestBuilder::form`] |
//! | `reqwest-json` | `json` | [`RequestBuilder::json`] (and `Response::json`) |
//! | `reqwest-multipart` | `multipart` | [`RequestBuilder::multipart`] |
//! | `reqwest-http2` | `http2` | none: HTTP/2 for the transport, and the retry layer recognises HTTP/2 refusals |
//!
//! # Timeouts
//!
//! [`RequestBuilder::timeout`] is this call's budget, counted from `send`,
//! for every attempt and backoff: `send` takes it off reqwest's request
//! and puts a `Deadline` in the stack's request, which the deadline layers
//! enforce and write on the wire. reqwest is not left to apply it too: it
//! would bound each attempt on its own, from the moment the transport
//! starts it. Leave `reqwest::ClientBuilder::timeout` unset for the same
//! reason (it is reqwest's, per attempt, and stays so).
//!
//! # reqwest's own retries
//!
//! reqwest 0.13's `Client` retries by itself, below the stack, inside one
//! of its attempts:
//!
//! - Its default policy (`ClientBuilder::retry` never called) resends
//!   "protocol NACKs", requests the server says it did not process: an
//!   HTTP/2 stream the server refused (`RST_STREAM` with
//!   `REFUSED_STREAM`), a stream a graceful `GOAWAY` (`NO_ERROR`) left
//!   out, and with reqwest's `http3` feature an HTTP/3 connection timeout.
//!   Up to 2 resends per request, with no retry budget, no backoff, and
//!   only for a body reqwest can copy (bytes, not a stream). Without
//!   reqwest's `http2` or `http3` feature, the policy finds nothing to
//!   retry; features unify, so another crate of your tree may turn them
//!   on.
//! - hyper-util's connection pool, below that, resends a request it never
//!   wrote because the idle connection it picked had closed
//!   (`retry_canceled_requests`, on; reqwest has no switch for it). None
//!   of that request reached the server.
//!
//! Both are safe for the server (what they resend was not processed, so
//! even a `POST` may be resent), but the stack does not see them: the
//! breaker counts one attempt (whose latency includes the resends), the
//! retry budget pays for none of them, and each of the stack's attempts
//! can be up to three on the wire. A server refusing streams because it
//! is overloaded is exactly what the breaker and the budget are there to
//! notice.
//!
//! So build the `reqwest::Client` with
//! [`ReqwestService::client_builder`], which is `reqwest::Client::builder()`
//! with `.retry(reqwest::retry::never())`: a refusal then reaches the
//! stack, whose retry layer retries it like any transient failure (an
//! idempotent or keyed request, with backoff, within the budget, each
//! attempt counted) once it recognises HTTP/2 refusals, which this crate's
//! `reqwest-http2` feature turns on together with reqwest's HTTP/2. The
//! price: a `POST` without an `Idempotency-Key` refused by an HTTP/2 server
//! fails instead of being resent. The pool's resend of an unwritten
//! request stays (it costs the server nothing and cannot be turned off).
//! [`ClientStack::reqwest`](crate::stack::ClientStack::reqwest) takes any
//! `reqwest::Client`, so reqwest's defaults remain yours to keep.
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
//!   reference counts). There, reqwest-middleware's `timeout` stays
//!   reqwest's own, per attempt.
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
//! is; and the requests `tower-http-client` builds come from its own
//! builder, not reqwest's, so they need not leave as reqwest would send
//! them. Either would also be one more crate that must reach each new
//! reqwest line (0.13 here) before we can. What fits is small: reqwest's
//! builder, wrapped and delegated to (the way reqwest-middleware's builder
//! wraps it), reqwest's finished `Request` turned into an `http::Request`,
//! and `Body::wrap` plus `From<http::Response<_>>` on the way back, with
//! no dependency beyond reqwest itself, so we ship and test our own.
//!
//! # Errors
//!
//! [`RequestBuilder::send`] returns a [`BoxError`](crate::BoxError): a
//! builder error or the transport's `reqwest::Error`, or a layer's typed
//! error, which callers downcast:
//!
//! ```
//! use tower_breaker::error::CircuitOpen;
//! use tower_breaker::{Breaker, Mode};
//! use tower_shield::stack::client_stack;
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
//! An error the stack's response body yields while the caller reads it
//! (`text()`, `bytes()`, `chunk()`) comes back as a `reqwest::Error`, with
//! the typed error in its `source()` chain; [`find_error`] finds it.
//!
//! # Pitfalls
//!
//! - Build the client once per dependency and clone it; a client built
//!   per request has a breaker that never sees more than one call.
//! - Leave `reqwest::ClientBuilder::timeout` unset: it bounds each
//!   attempt separately and is invisible to the breaker's slow-call
//!   counting; use the stack's `timeout` and [`RequestBuilder::timeout`].
//! - A `reqwest::Client` built with `reqwest::Client::new()` or a plain
//!   `builder()` keeps reqwest's own retries (see above).
//! - A `POST` or `PATCH` is retried only with an `Idempotency-Key` header.
//! - Responses of a [`Client`] come from reqwest's `From<http::Response>`;
//!   their `url()` and `remote_addr()` are the real ones (the transport
//!   keeps them in the response's extensions); a stack over another
//!   transport sets the URL with `reqwest::ResponseBuilderExt::url`, and
//!   its responses have no `remote_addr()`.

mod client;
mod error;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
mod middleware;
mod service;
mod transport;

pub use client::{Client, HttpRequest, RequestBuilder};
pub use error::find_error;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub use middleware::{downcast_error, StackMiddleware};
pub use service::{HttpResponse, ReqwestService, ResponseFuture};
pub use transport::ReqwestStack;
