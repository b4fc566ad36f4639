//! A reqwest-style client over a stack.

use std::fmt;
use std::future::poll_fn;
use std::time::Duration;

use ::reqwest::{Body, Method, Url, Version};
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use tower_resilience_base::Deadline;
use tower_service::Service;

use super::service::{ReqwestService, Template};
use crate::stack::ClientStackService;
use crate::BoxError;

/// The request a [`Client`]'s stack receives: an `http::Request` with
/// reqwest's body.
pub type HttpRequest = http::Request<Body>;

/// A reqwest-style client (`get`, `post`, ..., `send`) over a stack that
/// ends in [`ReqwestService`]: every call goes through the stack's
/// deadline, breaker, retries and bulkhead, and `send` returns a
/// `reqwest::Response`.
///
/// Build it with [`ClientStack::reqwest`](crate::stack::ClientStack::reqwest)
/// or, around any stack of [`HttpRequest`] to [`HttpResponse`], with
/// [`Client::new`]. The default type parameter is what
/// [`client_stack`](crate::stack::client_stack)`(..).reqwest(..)` builds,
/// so `Client` alone names it in a struct field.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use tower_breaker::stack::client_stack;
///
/// # async fn run() -> Result<(), tower_breaker::BoxError> {
/// let client = client_stack("catalog")
///     .timeout(Duration::from_secs(2))
///     .reqwest(reqwest::Client::new());
/// let items = client.get("http://127.0.0.1:3000/items").send().await?.text().await?;
/// # let _ = items;
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// Clones share the stack, and so its breaker, retry budget, bulkhead
/// compartment and the `reqwest::Client`'s connection pool. Build it once
/// per dependency and clone it.
pub struct Client<S = ClientStackService<ReqwestService>> {
    service: S,
}

impl<S> Client<S> {
    /// A client that sends every request through `service`, the finished
    /// stack. Build the stack once: it holds the breaker's and the budget's
    /// shared state.
    ///
    /// # Example
    ///
    /// ```
    /// use tower::Layer;
    /// use tower_breaker::reqwest::{Client, ReqwestService};
    /// use tower_breaker::stack::client_stack;
    ///
    /// let stack = client_stack("catalog").layer(ReqwestService::new(reqwest::Client::new()));
    /// let client = Client::new(stack);
    /// # let _ = client;
    /// ```
    pub fn new(service: S) -> Self {
        Self { service }
    }

    /// The stack.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker::stack::client_stack;
    ///
    /// let client = client_stack("catalog").reqwest(reqwest::Client::new());
    /// let _stack = client.get_ref();
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &S {
        &self.service
    }
}

impl<S: Clone> Client<S> {
    /// Starts a `GET` request to `url`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_breaker::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let response = client.get("http://127.0.0.1:3000/items").send().await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn get(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::GET, url)
    }

    /// Starts a `POST` request. The retry layer retries a `POST` only when
    /// it carries an `Idempotency-Key` header.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_breaker::stack::client_stack("orders").reqwest(reqwest::Client::new());
    /// let response = client
    ///     .post("http://127.0.0.1:3000/orders")
    ///     .header("idempotency-key", "order-42")
    ///     .body(r#"{"sku":"apples"}"#)
    ///     .send()
    ///     .await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn post(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::POST, url)
    }

    /// Starts a `PUT` request (idempotent: retried).
    pub fn put(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::PUT, url)
    }

    /// Starts a `PATCH` request (retried only with an `Idempotency-Key`).
    pub fn patch(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::PATCH, url)
    }

    /// Starts a `DELETE` request (idempotent: retried).
    pub fn delete(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::DELETE, url)
    }

    /// Starts a `HEAD` request.
    pub fn head(&self, url: impl AsRef<str>) -> RequestBuilder<S> {
        self.request(Method::HEAD, url)
    }

    /// Starts a request with any method. The URL is parsed here, once per
    /// call; a URL that does not parse makes [`send`](RequestBuilder::send)
    /// fail.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_breaker::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let response = client
    ///     .request(reqwest::Method::OPTIONS, "http://127.0.0.1:3000/items")
    ///     .send()
    ///     .await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn request(&self, method: Method, url: impl AsRef<str>) -> RequestBuilder<S> {
        RequestBuilder {
            service: self.service.clone(),
            request: new_request(method, url.as_ref()),
        }
    }
}

/// The `http::Request` of a call, with its [`Template`] (the URL parsed
/// once).
fn new_request(method: Method, url: &str) -> Result<HttpRequest, BoxError> {
    let url = Url::parse(url)?;
    let uri = http::Uri::try_from(url.as_str())?;
    let template = Template::new(uri.clone(), ::reqwest::Request::new(method.clone(), url));
    let mut request = HttpRequest::new(Body::from(""));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    request.extensions_mut().insert(template);
    Ok(request)
}

impl<S: Clone> Clone for Client<S> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
        }
    }
}

impl<S> fmt::Debug for Client<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("service", &std::any::type_name::<S>())
            .finish()
    }
}

/// A request being built by a [`Client`]; finish it with
/// [`send`](Self::send). An invalid URL, header name or value is kept and
/// reported by `send`, as reqwest does.
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder<S = ClientStackService<ReqwestService>> {
    service: S,
    request: Result<HttpRequest, BoxError>,
}

impl<S> RequestBuilder<S> {
    fn with(mut self, f: impl FnOnce(&mut HttpRequest) -> Result<(), BoxError>) -> Self {
        if let Ok(request) = &mut self.request {
            if let Err(e) = f(request) {
                self.request = Err(e);
            }
        }
        self
    }

    /// Adds a header (appended to any of the same name).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_breaker::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let response = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .header("accept", "application/json")
    ///     .send()
    ///     .await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn header<K, V>(self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.with(|request| {
            let name = HeaderName::try_from(name).map_err(Into::<http::Error>::into)?;
            let value = HeaderValue::try_from(value).map_err(Into::<http::Error>::into)?;
            request.headers_mut().append(name, value);
            Ok(())
        })
    }

    /// Adds every header of `headers`, replacing those of the same names.
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.with(|request| {
            for (name, value) in headers {
                if let Some(name) = name {
                    request.headers_mut().insert(name, value);
                }
            }
            Ok(())
        })
    }

    /// Sets `Authorization: Bearer <token>`, marked sensitive.
    pub fn bearer_auth(self, token: impl fmt::Display) -> Self {
        self.with(|request| {
            let mut value = HeaderValue::try_from(format!("Bearer {token}"))?;
            value.set_sensitive(true);
            request.headers_mut().insert(AUTHORIZATION, value);
            Ok(())
        })
    }

    /// Sets the body: bytes, a `String`, a `&'static str`, or any
    /// `reqwest::Body`. The retry layer replays bodies of up to 64 KiB by
    /// default; a larger one is sent once and never retried.
    pub fn body(self, body: impl Into<Body>) -> Self {
        self.with(|request| {
            *request.body_mut() = body.into();
            Ok(())
        })
    }

    /// A budget for this call, retries and backoffs included: a
    /// [`Deadline`] in the request's extensions, which the stack's deadline
    /// layers honour (the earliest deadline in scope wins). The call fails
    /// with `tower_deadline::error::DeadlineExceeded` when it passes.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_breaker::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let response = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .timeout(Duration::from_millis(300))
    ///     .send()
    ///     .await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn timeout(self, timeout: Duration) -> Self {
        self.with(|request| {
            request.extensions_mut().insert(Deadline::after(timeout));
            Ok(())
        })
    }

    /// Sets the HTTP version (the `reqwest::Client` must support it).
    pub fn version(self, version: Version) -> Self {
        self.with(|request| {
            *request.version_mut() = version;
            Ok(())
        })
    }

    /// Sends the request through the stack.
    ///
    /// # Errors
    ///
    /// An invalid URL, header or value given to this builder, or the
    /// stack's error: the transport's `reqwest::Error`, or a layer's typed
    /// error (`CircuitOpen`, `BulkheadFull`, `DeadlineExceeded`, ...),
    /// boxed, which callers can downcast:
    ///
    /// ```no_run
    /// use tower_breaker::error::CircuitOpen;
    ///
    /// # async fn run() {
    /// # let client = tower_breaker::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// match client.get("http://127.0.0.1:3000/items").send().await {
    ///     Ok(response) => println!("{}", response.status()),
    ///     Err(e) if e.is::<CircuitOpen>() => println!("not calling a dependency that is down"),
    ///     Err(e) => println!("failed: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn send<RB>(self) -> Result<::reqwest::Response, BoxError>
    where
        S: Service<HttpRequest, Response = http::Response<RB>>,
        S::Error: Into<BoxError>,
        RB: http_body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
        RB::Error: Into<BoxError>,
    {
        let mut service = self.service;
        let request = self.request?;
        poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        let response = service.call(request).await.map_err(Into::into)?;
        Ok(::reqwest::Response::from(
            response.map(::reqwest::Body::wrap),
        ))
    }
}

impl<S> fmt::Debug for RequestBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RequestBuilder");
        match &self.request {
            Ok(request) => d
                .field("method", request.method())
                .field("uri", request.uri())
                .field("headers", request.headers()),
            Err(e) => d.field("error", e),
        };
        d.finish_non_exhaustive()
    }
}
