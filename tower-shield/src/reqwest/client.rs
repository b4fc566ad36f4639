//! A client over a stack whose request builder is reqwest's own.

use std::fmt;
use std::future::{poll_fn, Future};
use std::time::Duration;

use ::reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use ::reqwest::{Body, IntoUrl, Method, Version};
use bytes::Bytes;
use tower_resilience_base::Deadline;
use tower_service::Service;

use super::service::{split, to_reqwest_response, ReqwestService, ReqwestTimeout};
use super::transport::ReqwestStack;
use crate::stack::ClientStackService;
use crate::BoxError;

/// The request a [`Client`]'s stack receives: an `http::Request` with
/// reqwest's body.
pub type HttpRequest = http::Request<Body>;

/// A reqwest-style client (`get`, `post`, ..., `send`) over a stack: every
/// call goes through the stack's deadline, breaker, retries and bulkhead,
/// and `send` returns a `reqwest::Response`.
///
/// Requests are built by reqwest's own `reqwest::RequestBuilder`, which
/// [`RequestBuilder`] wraps: every builder method is reqwest's, so a
/// request leaves exactly as reqwest would have built it. The
/// `reqwest::Client` held here only starts those builders; sending goes
/// through the stack `S`, at whose bottom a transport (usually
/// [`ReqwestService`]) hands each attempt to a `reqwest::Client`.
///
/// Build it with [`ClientStack::reqwest`](crate::stack::ClientStack::reqwest),
/// with [`Client::new`] around a stack of this crate's layers over a
/// [`ReqwestService`], or with [`Client::from_parts`] around any stack of
/// [`HttpRequest`] to `http::Response<B>`. The default type parameter is
/// what [`client_stack`](crate::stack::client_stack)`(..).reqwest(..)`
/// builds, so `Client` alone names it in a struct field.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use tower_shield::reqwest::ReqwestService;
/// use tower_shield::stack::client_stack;
///
/// # async fn run() -> Result<(), tower_breaker::BoxError> {
/// let client = client_stack("catalog")
///     .timeout(Duration::from_secs(2))
///     .reqwest(ReqwestService::client_builder().build()?);
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
    reqwest: ::reqwest::Client,
    service: S,
}

impl<S> Client<S> {
    /// A client that sends every request through `service`, a stack of
    /// this crate's layers with a [`ReqwestService`] at the bottom, whose
    /// `reqwest::Client` also starts the request builders. Build the stack
    /// once: it holds the breaker's and the budget's shared state.
    ///
    /// For a stack with other layers or another transport, use
    /// [`Client::from_parts`].
    ///
    /// # Example
    ///
    /// ```
    /// use tower::Layer;
    /// use tower_shield::reqwest::{Client, ReqwestService};
    /// use tower_shield::stack::client_stack;
    ///
    /// # fn main() -> Result<(), reqwest::Error> {
    /// let transport = ReqwestService::new(ReqwestService::client_builder().build()?);
    /// let client = Client::new(client_stack("catalog").layer(transport));
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(service: S) -> Self
    where
        S: ReqwestStack,
    {
        let reqwest = service.reqwest_client().clone();
        Self { reqwest, service }
    }

    /// A client that starts its request builders with `reqwest` and sends
    /// every request through `service`, any stack of [`HttpRequest`] to
    /// `http::Response<B>` (see [`RequestBuilder::send`] for the bounds).
    /// `reqwest` is only a builder factory: its settings (default headers,
    /// timeouts, proxies) apply only if it is also the client at the
    /// bottom of `service`.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceBuilder;
    /// use tower_shield::reqwest::{Client, ReqwestService};
    ///
    /// # fn main() -> Result<(), reqwest::Error> {
    /// let transport = ReqwestService::client_builder().build()?;
    /// // tower's own layers, which `Client::new` does not look through.
    /// let stack = ServiceBuilder::new()
    ///     .concurrency_limit(16)
    ///     .service(ReqwestService::new(transport.clone()));
    /// let client = Client::from_parts(transport, stack);
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_parts(reqwest: ::reqwest::Client, service: S) -> Self {
        Self { reqwest, service }
    }

    /// The stack.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::stack::client_stack;
    ///
    /// let client = client_stack("catalog").reqwest(reqwest::Client::new());
    /// let _stack = client.get_ref();
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    /// The `reqwest::Client` that starts the request builders.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::stack::client_stack;
    ///
    /// let client = client_stack("catalog").reqwest(reqwest::Client::new());
    /// let _reqwest: &reqwest::Client = client.reqwest_client();
    /// ```
    #[must_use]
    pub fn reqwest_client(&self) -> &::reqwest::Client {
        &self.reqwest
    }
}

impl<S: Clone> Client<S> {
    /// Starts a `GET` request to `url`.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let response = client.get("http://127.0.0.1:3000/items").send().await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::GET, url)
    }

    /// Starts a `POST` request. The retry layer retries a `POST` only when
    /// it carries an `Idempotency-Key` header.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_shield::stack::client_stack("orders").reqwest(reqwest::Client::new());
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
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::POST, url)
    }

    /// Starts a `PUT` request (idempotent: retried).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.put("http://127.0.0.1:3000/items/7").build()?;
    /// assert_eq!(request.method(), reqwest::Method::PUT);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::PUT, url)
    }

    /// Starts a `PATCH` request (retried only with an `Idempotency-Key`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.patch("http://127.0.0.1:3000/items/7").build()?;
    /// assert_eq!(request.method(), reqwest::Method::PATCH);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::PATCH, url)
    }

    /// Starts a `DELETE` request (idempotent: retried).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.delete("http://127.0.0.1:3000/items/7").build()?;
    /// assert_eq!(request.method(), reqwest::Method::DELETE);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::DELETE, url)
    }

    /// Starts a `HEAD` request.
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.head("http://127.0.0.1:3000/items").build()?;
    /// assert_eq!(request.method(), reqwest::Method::HEAD);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn head<U: IntoUrl>(&self, url: U) -> RequestBuilder<S> {
        self.request(Method::HEAD, url)
    }

    /// Starts a request with any method: reqwest's
    /// `Client::request(method, url)`, so the URL is parsed here, and its
    /// userinfo (`http://user:password@host/`) becomes an
    /// `Authorization: Basic` header, as reqwest does. A URL that does not
    /// parse makes [`send`](RequestBuilder::send) fail.
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .request(reqwest::Method::OPTIONS, "http://ops:secret@127.0.0.1:3000/items")
    ///     .build()?;
    /// assert_eq!(request.url().as_str(), "http://127.0.0.1:3000/items");
    /// assert_eq!(request.headers()["authorization"], "Basic b3BzOnNlY3JldA==");
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder<S> {
        RequestBuilder {
            service: self.service.clone(),
            inner: self.reqwest.request(method, url),
        }
    }

    /// Sends a `reqwest::Request` (built with
    /// [`RequestBuilder::build`], say, then changed) through the stack,
    /// as reqwest's `Client::execute` does. The request's `timeout` is
    /// this call's budget, counted from now; see
    /// [`RequestBuilder::timeout`].
    ///
    /// # Errors
    ///
    /// As [`RequestBuilder::send`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let mut request = client.get("http://127.0.0.1:3000/items").build()?;
    /// request.url_mut().set_path("/items/7");
    /// let response = client.execute(request).await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute<B>(
        &self,
        request: ::reqwest::Request,
    ) -> impl Future<Output = Result<::reqwest::Response, BoxError>>
    where
        S: Service<HttpRequest, Response = http::Response<B>>,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + Sync + 'static,
        B::Data: Into<Bytes>,
        B::Error: Into<BoxError>,
    {
        call(self.service.clone(), Ok(request))
    }
}

/// Sends `request` through `service`. The request's `timeout` becomes a
/// [`Deadline`] now, before the returned future is first polled, so that
/// it counts from the `send` (or `execute`) that made the future.
fn call<S, B>(
    mut service: S,
    request: ::reqwest::Result<::reqwest::Request>,
) -> impl Future<Output = Result<::reqwest::Response, BoxError>>
where
    S: Service<HttpRequest, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let request = request.map_err(BoxError::from).and_then(prepare);
    async move {
        let request = request?;
        poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        let response = service.call(request).await.map_err(Into::into)?;
        Ok(to_reqwest_response(response))
    }
}

/// The stack's request for a finished `reqwest::Request`, its `timeout`
/// turned into a [`Deadline`] from now.
fn prepare(request: ::reqwest::Request) -> Result<HttpRequest, BoxError> {
    // reqwest's own per-request timeout would bound each attempt on its
    // own, from the moment the transport starts it; the stack's deadline
    // bounds the whole call instead, retries included.
    let (mut request, timeout) = split(request, ReqwestTimeout::Take)?;
    if let Some(timeout) = timeout {
        request.extensions_mut().insert(Deadline::after(timeout));
    }
    Ok(request)
}

impl<S: Clone> Clone for Client<S> {
    fn clone(&self) -> Self {
        Self {
            reqwest: self.reqwest.clone(),
            service: self.service.clone(),
        }
    }
}

impl<S> fmt::Debug for Client<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("service", &std::any::type_name::<S>())
            .finish_non_exhaustive()
    }
}

/// A request being built by a [`Client`]: reqwest's own
/// `reqwest::RequestBuilder`, every method delegated to it, and the stack
/// the request will go through. Finish it with [`send`](Self::send).
///
/// What reqwest's builder does, this one does, because it is reqwest's:
/// headers are appended, [`headers`](Self::headers) merges a whole map as
/// reqwest merges it, an invalid URL, header name or value is kept and
/// reported by `send`, a URL's userinfo becomes `Authorization: Basic`.
/// [`query`](Self::query), [`form`](Self::form), [`json`](Self::json) and
/// [`multipart`](Self::multipart) need this crate's features
/// `reqwest-query`, `reqwest-form`, `reqwest-json` and
/// `reqwest-multipart`, which turn on reqwest's features of the same
/// names; anything else reqwest's builder has is at hand through
/// [`map_reqwest`](Self::map_reqwest).
///
/// Only [`timeout`](Self::timeout) means more here: this call's budget,
/// counted from `send`, for all its attempts.
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder<S = ClientStackService<ReqwestService>> {
    service: S,
    inner: ::reqwest::RequestBuilder,
}

impl<S> RequestBuilder<S> {
    /// Applies `f` to the `reqwest::RequestBuilder` inside: the way to any
    /// builder method of reqwest that this type does not repeat (one of a
    /// newer reqwest, say). Everything `f` sets goes down the stack as
    /// reqwest built it; a `timeout` set there is this call's budget, as
    /// with [`timeout`](Self::timeout).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .map_reqwest(|builder| builder.header("x-trace", "on"))
    ///     .build()?;
    /// assert_eq!(request.headers()["x-trace"], "on");
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn map_reqwest(
        mut self,
        f: impl FnOnce(::reqwest::RequestBuilder) -> ::reqwest::RequestBuilder,
    ) -> Self {
        self.inner = f(self.inner);
        self
    }

    /// Adds a header, appended to any of the same name (reqwest's
    /// `header`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .header("accept", "application/json")
    ///     .header("accept", "text/plain")
    ///     .build()?;
    /// let accept: Vec<_> = request.headers().get_all("accept").iter().collect();
    /// assert_eq!(accept, ["application/json", "text/plain"]);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn header<K, V>(self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.map_reqwest(|b| b.header(key, value))
    }

    /// Merges `headers` into the request's, as reqwest's `headers` does:
    /// every value of `headers` is kept (a name given several values sends
    /// them all), and a name `headers` holds replaces the values the
    /// request had under that name.
    ///
    /// # Example
    ///
    /// ```
    /// use reqwest::header::{HeaderMap, HeaderValue};
    ///
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let mut tags = HeaderMap::new();
    /// tags.append("x-tag", HeaderValue::from_static("red"));
    /// tags.append("x-tag", HeaderValue::from_static("blue"));
    /// let request = client.get("http://127.0.0.1:3000/items").headers(tags).build()?;
    /// let sent: Vec<_> = request.headers().get_all("x-tag").iter().collect();
    /// assert_eq!(sent, ["red", "blue"]);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.map_reqwest(|b| b.headers(headers))
    }

    /// HTTP basic authentication: an `Authorization: Basic` header, marked
    /// sensitive (reqwest's `basic_auth`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .basic_auth("ops", Some("secret"))
    ///     .build()?;
    /// assert_eq!(request.headers()["authorization"], "Basic b3BzOnNlY3JldA==");
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn basic_auth<U, P>(self, username: U, password: Option<P>) -> Self
    where
        U: fmt::Display,
        P: fmt::Display,
    {
        self.map_reqwest(|b| b.basic_auth(username, password))
    }

    /// Bearer authentication: `Authorization: Bearer <token>`, marked
    /// sensitive (reqwest's `bearer_auth`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.get("http://127.0.0.1:3000/items").bearer_auth("t0ken").build()?;
    /// assert_eq!(request.headers()["authorization"], "Bearer t0ken");
    /// assert!(request.headers()["authorization"].is_sensitive());
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn bearer_auth<T>(self, token: T) -> Self
    where
        T: fmt::Display,
    {
        self.map_reqwest(|b| b.bearer_auth(token))
    }

    /// Sets the body: bytes, a `String`, a `&'static str`, or any
    /// `reqwest::Body` (`reqwest::Body::wrap` takes any `http_body::Body`).
    /// The retry layer replays bodies of up to 64 KiB by default; a larger
    /// one is sent once and never retried.
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("orders").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .post("http://127.0.0.1:3000/orders")
    ///     .body(r#"{"sku":"apples"}"#)
    ///     .build()?;
    /// assert_eq!(request.body().and_then(reqwest::Body::as_bytes), Some(&br#"{"sku":"apples"}"#[..]));
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn body<T: Into<Body>>(self, body: T) -> Self {
        self.map_reqwest(|b| b.body(body))
    }

    /// A budget for this call, retries and backoffs included, counted from
    /// [`send`](Self::send) (not from this method).
    ///
    /// reqwest's builder records it; `send` takes it off the request and
    /// puts a [`Deadline`] of `send`'s instant plus `timeout` in the
    /// request's extensions, which the stack's deadline layers enforce
    /// (the earliest deadline in scope wins) and write on the wire as the
    /// budget left (`x-request-timeout-ms`). The call fails with
    /// `tower_deadline::error::DeadlineExceeded` when it passes. reqwest
    /// does not also apply it: it would bound each attempt separately,
    /// unseen by the retry layer. The deadline bounds the call until the
    /// stack answers; a stack whose response body keeps the deadline
    /// bounds the reading of the body too.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
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
        self.map_reqwest(|b| b.timeout(timeout))
    }

    /// Sets the HTTP version (the `reqwest::Client` must support it).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:3000/items")
    ///     .version(reqwest::Version::HTTP_11)
    ///     .build()?;
    /// assert_eq!(request.version(), reqwest::Version::HTTP_11);
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn version(self, version: Version) -> Self {
        self.map_reqwest(|b| b.version(version))
    }

    /// Adds `query` to the URL's query string, after any pairs it already
    /// has, encoded as reqwest encodes it (reqwest's `query`; feature
    /// `reqwest-query`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .get("http://127.0.0.1:3000/items?page=2")
    ///     .query(&[("q", "red apples"), ("sort", "price")])
    ///     .build()?;
    /// assert_eq!(request.url().query(), Some("page=2&q=red+apples&sort=price"));
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    #[cfg(feature = "reqwest-query")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-query")))]
    pub fn query<T: serde::Serialize + ?Sized>(self, query: &T) -> Self {
        self.map_reqwest(|b| b.query(query))
    }

    /// A URL-encoded form body, with `Content-Type:
    /// application/x-www-form-urlencoded` unless one is set (reqwest's
    /// `form`; feature `reqwest-form`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("orders").reqwest(reqwest::Client::new());
    /// let request = client
    ///     .post("http://127.0.0.1:3000/orders")
    ///     .form(&[("sku", "apples"), ("note", "ripe & red")])
    ///     .build()?;
    /// assert_eq!(request.headers()["content-type"], "application/x-www-form-urlencoded");
    /// assert_eq!(
    ///     request.body().and_then(reqwest::Body::as_bytes),
    ///     Some(&b"sku=apples&note=ripe+%26+red"[..])
    /// );
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    #[cfg(feature = "reqwest-form")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-form")))]
    pub fn form<T: serde::Serialize + ?Sized>(self, form: &T) -> Self {
        self.map_reqwest(|b| b.form(form))
    }

    /// A JSON body, with `Content-Type: application/json` unless one is
    /// set (reqwest's `json`; feature `reqwest-json`).
    ///
    /// # Example
    ///
    /// ```
    /// use std::collections::BTreeMap;
    ///
    /// # let client = tower_shield::stack::client_stack("orders").reqwest(reqwest::Client::new());
    /// let order = BTreeMap::from([("sku", "apples"), ("quantity", "3")]);
    /// let request = client.post("http://127.0.0.1:3000/orders").json(&order).build()?;
    /// assert_eq!(request.headers()["content-type"], "application/json");
    /// assert_eq!(
    ///     request.body().and_then(reqwest::Body::as_bytes),
    ///     Some(&br#"{"quantity":"3","sku":"apples"}"#[..])
    /// );
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    #[cfg(feature = "reqwest-json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-json")))]
    pub fn json<T: serde::Serialize + ?Sized>(self, json: &T) -> Self {
        self.map_reqwest(|b| b.json(json))
    }

    /// A `multipart/form-data` body, with its `Content-Type` (boundary
    /// included) and, when every part's length is known, its
    /// `Content-Length` (reqwest's `multipart`; feature
    /// `reqwest-multipart`). The body is a stream: the retry layer replays
    /// it only if it fits the replay buffer (64 KiB by default).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("uploads").reqwest(reqwest::Client::new());
    /// let form = reqwest::multipart::Form::new().text("sku", "apples");
    /// let request = client.post("http://127.0.0.1:3000/uploads").multipart(form).build()?;
    /// let content_type = request.headers()["content-type"].to_str().unwrap_or_default();
    /// assert!(content_type.starts_with("multipart/form-data; boundary="));
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    #[cfg(feature = "reqwest-multipart")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-multipart")))]
    pub fn multipart(self, form: ::reqwest::multipart::Form) -> Self {
        self.map_reqwest(|b| b.multipart(form))
    }

    /// The finished `reqwest::Request`, as reqwest built it (its
    /// `timeout()` still set): to inspect it, or to change it and send it
    /// with [`Client::execute`].
    ///
    /// # Errors
    ///
    /// The first error a builder method met (an invalid URL, header name
    /// or value, a body that did not serialize), as reqwest's builder
    /// reports it.
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let request = client.get("http://127.0.0.1:3000/items").build()?;
    /// assert_eq!(request.url().path(), "/items");
    /// assert!(client.get("not a url").build().is_err());
    /// # Ok::<(), reqwest::Error>(())
    /// ```
    pub fn build(self) -> ::reqwest::Result<::reqwest::Request> {
        self.inner.build()
    }

    /// The finished `reqwest::Request` and a [`Client`] over the same stack
    /// to [`execute`](Client::execute) it with.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), in the second half of the pair.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let (client, request) = client.get("http://127.0.0.1:3000/items").build_split();
    /// let response = client.execute(request?).await?;
    /// # let _ = response;
    /// # Ok(())
    /// # }
    /// ```
    pub fn build_split(self) -> (Client<S>, ::reqwest::Result<::reqwest::Request>) {
        let (reqwest, request) = self.inner.build_split();
        let client = Client {
            reqwest,
            service: self.service,
        };
        (client, request)
    }

    /// Sends the request through the stack and returns reqwest's answer.
    ///
    /// reqwest's builder finishes the request first (so the URL's userinfo,
    /// the query string, the form and JSON bodies are exactly reqwest's);
    /// its [`timeout`](Self::timeout), if any, becomes the call's deadline,
    /// counted from this call. The stack may answer with any body `B`
    /// (`http_body::Body<Data: Into<Bytes>>`, `Send + Sync + 'static`, its
    /// error `Into<BoxError>`): it becomes the `reqwest::Response`'s body
    /// through `reqwest::Body::wrap`, and an error it yields while being
    /// read comes back from `text()`, `bytes()` or `chunk()` as a
    /// `reqwest::Error` whose `source()` chain holds it, typed: find it
    /// with [`find_error`](super::find_error).
    ///
    /// # Errors
    ///
    /// A builder error (`reqwest::Error`, [`is_builder`]), or the stack's:
    /// the transport's `reqwest::Error`, or a layer's typed error
    /// (`CircuitOpen`, `BulkheadFull`, `DeadlineExceeded`, ...), boxed,
    /// which callers can downcast:
    ///
    /// [`is_builder`]: ::reqwest::Error::is_builder
    ///
    /// ```no_run
    /// use tower_breaker::error::CircuitOpen;
    ///
    /// # async fn run() {
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// match client.get("http://127.0.0.1:3000/items").send().await {
    ///     Ok(response) => println!("{}", response.status()),
    ///     Err(e) if e.is::<CircuitOpen>() => println!("not calling a dependency that is down"),
    ///     Err(e) => println!("failed: {e}"),
    /// }
    /// # }
    /// ```
    pub fn send<B>(self) -> impl Future<Output = Result<::reqwest::Response, BoxError>>
    where
        S: Service<HttpRequest, Response = http::Response<B>>,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + Sync + 'static,
        B::Data: Into<Bytes>,
        B::Error: Into<BoxError>,
    {
        call(self.service, self.inner.build())
    }
}

impl<S: Clone> RequestBuilder<S> {
    /// A copy of this builder, or `None` when its body is a stream that
    /// cannot be copied (reqwest's `try_clone`).
    ///
    /// # Example
    ///
    /// ```
    /// # let client = tower_shield::stack::client_stack("catalog").reqwest(reqwest::Client::new());
    /// let builder = client.post("http://127.0.0.1:3000/orders").body("apples");
    /// assert!(builder.try_clone().is_some());
    /// ```
    #[must_use]
    pub fn try_clone(&self) -> Option<Self> {
        Some(Self {
            service: self.service.clone(),
            inner: self.inner.try_clone()?,
        })
    }
}

impl<S> fmt::Debug for RequestBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // reqwest's own (method, URL and headers, or the error).
        fmt::Debug::fmt(&self.inner, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reqwest::service::Template;

    /// The timeout leaves reqwest's request: it is the stack's deadline
    /// now, and the request that goes down (built from the call's
    /// template) carries no per-attempt timeout of reqwest's.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_timeout_becomes_a_deadline_and_leaves_reqwests_request() {
        let reqwest = ::reqwest::Client::new();
        let request = reqwest
            .get("http://127.0.0.1:9/items?page=2")
            .header("x-tag", "a")
            .timeout(Duration::from_millis(300))
            .build()
            .expect("a request");
        let now = tokio::time::Instant::now();
        let mut request = prepare(request).expect("prepared");

        assert_eq!(
            Deadline::from_extensions(request.extensions()),
            Some(Deadline::after_from(now, Duration::from_millis(300)))
        );
        assert_eq!(request.uri(), "http://127.0.0.1:9/items?page=2");
        assert_eq!(request.headers()["x-tag"], "a");
        let template = request
            .extensions_mut()
            .remove::<Template>()
            .expect("a template");
        let (mut parts, ()) = request.map(|_| ()).into_parts();
        let attempt = template.attempt(&mut parts).expect("the URI fits");
        assert_eq!(attempt.timeout(), None);
        assert_eq!(attempt.url().as_str(), "http://127.0.0.1:9/items?page=2");
        assert_eq!(attempt.headers()["x-tag"], "a");
    }

    /// Without a timeout, no deadline is added.
    #[test]
    fn no_timeout_no_deadline() {
        let request = ::reqwest::Client::new()
            .get("http://127.0.0.1:9/items")
            .build()
            .expect("a request");
        let request = prepare(request).expect("prepared");
        assert_eq!(Deadline::from_extensions(request.extensions()), None);
    }
}
