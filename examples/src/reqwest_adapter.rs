//! `reqwest::Client` as a tower service, and a small reqwest-style client
//! over any stack of layers.
//!
//! reqwest already implements `tower::Service<reqwest::Request>`, but the
//! layers of this toolkit speak `http::Request` / `http::Response` (they read
//! and write headers and extensions, and the retry layer replays bodies). Two
//! pieces bridge the gap:
//!
//! - [`ReqwestService`] takes an `http::Request<B>` for any body `B`
//!   (including the retry layer's `ReplayBody`), converts it with
//!   `reqwest::Request::try_from` after wrapping the body with
//!   `reqwest::Body::wrap` (no reqwest feature needed), sends it, and
//!   returns an `http::Response<reqwest::Body>`.
//! - [`Client`] holds the finished stack and offers `get`, `post`, `put`,
//!   `delete` and `request`, which return a [`RequestBuilder`] with
//!   `header`, `body`, `timeout` and `send`; `send` returns a
//!   `reqwest::Response`, so `status()`, `headers()`, `text()` and
//!   `bytes()` work as usual.
//!
//! ```no_run
//! use std::time::Duration;
//! use examples::reqwest_adapter::{Client, ReqwestService};
//! use tower::ServiceBuilder;
//! use tower_breaker::{Breaker, BreakerLayer};
//! use tower_bulkhead::BulkheadLayer;
//! use tower_deadline::ClientDeadlineLayer;
//! use tower_retry_budget::RetryLayer;
//!
//! # async fn run() -> Result<(), tower::BoxError> {
//! let stack = ServiceBuilder::new()
//!     .layer(ClientDeadlineLayer::new().default_timeout(Duration::from_secs(2)))
//!     .layer(BreakerLayer::new(Breaker::new("inventory")))
//!     .layer(RetryLayer::new())
//!     .layer(BulkheadLayer::new("inventory", 32))
//!     .layer(ClientDeadlineLayer::new())
//!     .service(ReqwestService::new(reqwest::Client::new()));
//! let client = Client::new(stack);
//!
//! let response = client.get("http://127.0.0.1:3000/items").send().await?;
//! println!("{}: {}", response.status(), response.text().await?);
//! # Ok(())
//! # }
//! ```
//!
//! Limits: the `reqwest::Response` built from an `http::Response` does not
//! know its URL (`url()` is a placeholder), and request bodies are bytes
//! (`Full<Bytes>`), which the retry layer buffers for replay up to its
//! limit.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::Method;
use http_body_util::Full;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};
use tower_deadline::Deadline;

/// The boxed error of the stacked [`Client`], as in tower.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request type a [`Client`]'s stack receives.
pub type HttpRequest = http::Request<Full<Bytes>>;

/// The response type [`ReqwestService`] returns and a [`Client`]'s stack
/// must return.
pub type HttpResponse = http::Response<reqwest::Body>;

/// `reqwest::Client` as a `tower::Service<http::Request<B>>`: the transport
/// at the bottom of a stack.
///
/// Configure connection settings (connect timeout, pool) on the
/// `reqwest::Client`; leave its request `timeout` unset and let the
/// deadline layers bound each call.
///
/// # Clone
///
/// Clones share the `reqwest::Client`, and so its connection pool.
#[derive(Debug, Clone)]
pub struct ReqwestService {
    client: reqwest::Client,
}

impl ReqwestService {
    /// Wraps a `reqwest::Client`.
    pub fn new(client: reqwest::Client) -> Self {
        Self { client }
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &reqwest::Client {
        &self.client
    }
}

/// The response future of [`ReqwestService`].
pub type ReqwestFuture = Pin<Box<dyn Future<Output = Result<HttpResponse, reqwest::Error>> + Send>>;

impl<B> Service<http::Request<B>> for ReqwestService
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = HttpResponse;
    type Error = reqwest::Error;
    type Future = ReqwestFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // reqwest's pool never applies backpressure.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let request = request.map(reqwest::Body::wrap);
        match reqwest::Request::try_from(request) {
            Ok(request) => {
                let sent = self.client.execute(request);
                Box::pin(async move { sent.await.map(HttpResponse::from) })
            }
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

/// A reqwest-style client over a stack of layers that ends in
/// [`ReqwestService`] (or any service of [`HttpRequest`] to
/// [`HttpResponse`]).
///
/// # Clone
///
/// Clones share the stack, and so its breaker, budget and compartments.
#[derive(Clone)]
pub struct Client {
    service: BoxCloneSyncService<HttpRequest, HttpResponse, BoxError>,
}

impl Client {
    /// A client that sends every request through `service`, the finished
    /// stack (build it once: the stack holds the breaker's and the budget's
    /// shared state).
    pub fn new<S>(service: S) -> Self
    where
        S: Service<HttpRequest, Response = HttpResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        Self {
            service: BoxCloneSyncService::new(service.map_err(Into::into)),
        }
    }

    /// Starts a `GET` request.
    pub fn get(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Starts a `POST` request (retried only with an `Idempotency-Key`).
    pub fn post(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Starts a `PUT` request.
    pub fn put(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// Starts a `DELETE` request.
    pub fn delete(&self, url: impl AsRef<str>) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// Starts a request with any method.
    pub fn request(&self, method: Method, url: impl AsRef<str>) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            builder: http::Request::builder().method(method).uri(url.as_ref()),
            body: Bytes::new(),
            deadline: None,
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// A request being built by a [`Client`]; finish it with
/// [`send`](Self::send).
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder {
    client: Client,
    builder: http::request::Builder,
    body: Bytes,
    deadline: Option<Deadline>,
}

impl RequestBuilder {
    /// Adds a header. An invalid name or value makes `send` fail.
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.builder = self.builder.header(name, value);
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// A budget for this call: a `tower_deadline::Deadline` in the
    /// request's extensions, which the deadline layers of the stack honour
    /// (the earliest deadline in scope wins).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Some(Deadline::after(timeout));
        self
    }

    /// Sends the request through the stack.
    ///
    /// # Errors
    ///
    /// An invalid request, or the stack's error: the transport's
    /// `reqwest::Error`, or a layer's typed error (`CircuitOpen`,
    /// `BulkheadFull`, `DeadlineExceeded`, ...), which callers can
    /// downcast.
    pub async fn send(self) -> Result<reqwest::Response, BoxError> {
        let mut request = self.builder.body(Full::new(self.body))?;
        if let Some(deadline) = self.deadline {
            request.extensions_mut().insert(deadline);
        }
        let response = self.client.service.oneshot(request).await?;
        Ok(reqwest::Response::from(response))
    }
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("builder", &self.builder)
            .field("body_len", &self.body.len())
            .field("deadline", &self.deadline)
            .finish()
    }
}
