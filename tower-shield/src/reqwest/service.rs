//! `reqwest::Client` as the transport at the bottom of a stack.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::client::HttpRequest;
use crate::BoxError;

/// The response of [`ReqwestService`]: the `http::Response` the layers
/// judge, with reqwest's body (and the response's URL, so that
/// `reqwest::Response::from` gives it back).
pub type HttpResponse = http::Response<::reqwest::Body>;

/// `reqwest::Client` as a `tower::Service<http::Request<B>>`, for any body
/// `B` (the retry layer's `ReplayBody` included): the transport at the
/// bottom of a [`ClientStack`](crate::stack::ClientStack).
///
/// Each attempt becomes a `reqwest::Request` sent with the client; the
/// answer comes back as an [`HttpResponse`], whose extensions carry the
/// final URL. A request built by this module's [`Client`](super::Client)
/// (or passing through [`StackMiddleware`](super)) carries its parsed URL,
/// so an attempt costs no URL parsing; any other request's URI is parsed
/// once per attempt. The `http::Request`'s extensions (the stack's call
/// context) stay in the stack: reqwest gets the method, URI, version,
/// headers and body.
///
/// Configure connection settings (connect timeout, pool, TLS) on the
/// `reqwest::Client`; leave its request `timeout` unset and let the
/// stack's deadline bound each call. Build it with
/// [`ReqwestService::client_builder`], which turns reqwest's own retries
/// off so that every attempt on the wire is one the breaker counts and the
/// budget pays for (see the [module docs](super#reqwests-own-retries)).
///
/// # Example
///
/// ```no_run
/// use tower::{Layer, ServiceExt};
/// use tower_shield::reqwest::ReqwestService;
/// use tower_shield::stack::client_stack;
///
/// # async fn run() -> Result<(), tower_breaker::BoxError> {
/// let stack = client_stack("catalog").layer(ReqwestService::new(reqwest::Client::new()));
/// let request = http::Request::get("http://127.0.0.1:3000/items").body(reqwest::Body::from(""))?;
/// let response = stack.oneshot(request).await?;
/// println!("{}", response.status());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// `reqwest::Error`: an invalid request (a URI reqwest cannot take) or a
/// failed exchange (connection, protocol, reqwest's own timeouts).
///
/// # Clone
///
/// Clones share the `reqwest::Client`, and so its connection pool.
#[derive(Debug, Clone)]
pub struct ReqwestService {
    client: ::reqwest::Client,
}

impl ReqwestService {
    /// Puts `client` at the bottom of a stack.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::reqwest::ReqwestService;
    ///
    /// let transport = ReqwestService::new(reqwest::Client::new());
    /// # let _ = transport;
    /// ```
    pub fn new(client: ::reqwest::Client) -> Self {
        Self { client }
    }

    /// A `reqwest::ClientBuilder` for the bottom of a stack: reqwest's
    /// defaults, except that reqwest's own retries are off
    /// (`.retry(reqwest::retry::never())`). Add your settings (connect
    /// timeout, pool, TLS) and `build()` it.
    ///
    /// reqwest 0.13's default policy resends, up to twice and with no
    /// budget, a request that an HTTP/2 server refused (`REFUSED_STREAM`)
    /// or that a graceful `GOAWAY` left unprocessed (and, with reqwest's
    /// `http3` feature, an HTTP/3 connection timeout). Those attempts
    /// happen inside one of the stack's attempts: the breaker never sees
    /// them and the retry budget never pays for them. With them off, the
    /// error reaches the stack, whose retry layer retries it like any
    /// transient failure (idempotent or keyed requests, with backoff and
    /// budget, each attempt counted) once it recognises HTTP/2 refusals:
    /// this crate's `reqwest-http2` feature turns on reqwest's HTTP/2 and
    /// that recognition together.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_shield::reqwest::ReqwestService;
    /// use tower_shield::stack::client_stack;
    ///
    /// # fn main() -> Result<(), reqwest::Error> {
    /// let transport = ReqwestService::client_builder()
    ///     .connect_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// let client = client_stack("catalog").reqwest(transport);
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    pub fn client_builder() -> ::reqwest::ClientBuilder {
        ::reqwest::Client::builder().retry(::reqwest::retry::never())
    }

    /// The wrapped client.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::reqwest::ReqwestService;
    ///
    /// let transport = ReqwestService::new(reqwest::Client::new());
    /// let _client: &reqwest::Client = transport.get_ref();
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &::reqwest::Client {
        &self.client
    }
}

/// The parsed form of a request's URL, put in the request's extensions
/// once per call so that no attempt parses it again, and the URI it was
/// built for: an attempt whose URI a layer changed is parsed instead.
///
/// A request that carries nothing of reqwest's own but its method, URL,
/// version, headers, body and timeout (every request reqwest's builder
/// makes) keeps only the URL and the timeout: an attempt is a new
/// `reqwest::Request` for a copy of the URL (one allocation), with the
/// timeout when there is one ([`StackMiddleware`](super) leaves it to each
/// attempt; [`Client`](super::Client) has taken it for the call's
/// deadline). One that carries more of reqwest's private extensions (a
/// request converted from an `http::Request` with extensions of its own)
/// keeps the whole request, without its body and headers, and an attempt
/// is a clone of it (`reqwest::Request::try_clone`).
#[derive(Clone)]
pub(crate) struct Template(Arc<TemplateInner>);

enum TemplateInner {
    Plain {
        uri: http::Uri,
        url: ::reqwest::Url,
        timeout: Option<Duration>,
    },
    Extended {
        uri: http::Uri,
        request: ::reqwest::Request,
    },
}

impl Template {
    fn uri(&self) -> &http::Uri {
        match &*self.0 {
            TemplateInner::Plain { uri, .. } | TemplateInner::Extended { uri, .. } => uri,
        }
    }

    /// Whether each attempt is a clone of a whole `reqwest::Request`.
    #[cfg(test)]
    pub(super) fn is_extended(&self) -> bool {
        matches!(&*self.0, TemplateInner::Extended { .. })
    }

    /// The `reqwest::Request` of one attempt, if this template fits it
    /// (its method and headers are then moved out of `parts`).
    pub(super) fn attempt(&self, parts: &mut http::request::Parts) -> Option<::reqwest::Request> {
        if !same_uri(&parts.uri, self.uri()) {
            return None;
        }
        let method = std::mem::take(&mut parts.method);
        let mut request = match &*self.0 {
            TemplateInner::Plain { url, timeout, .. } => {
                let mut request = ::reqwest::Request::new(method, url.clone());
                if timeout.is_some() {
                    *request.timeout_mut() = *timeout;
                }
                request
            }
            TemplateInner::Extended { request, .. } => {
                // The template has no body, so the clone always succeeds.
                let mut request = request.try_clone()?;
                *request.method_mut() = method;
                request
            }
        };
        *request.headers_mut() = std::mem::take(&mut parts.headers);
        *request.version_mut() = parts.version;
        Some(request)
    }
}

/// Whether `a` and `b` are the same URI: at once when one is a clone of
/// the other (their authority and path are the same bytes, as when no
/// layer changed the call's URI), by comparing them otherwise.
fn same_uri(a: &http::Uri, b: &http::Uri) -> bool {
    fn shared(a: Option<&str>, b: Option<&str>) -> bool {
        match (a, b) {
            // The same address and length: the same bytes.
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
    let clone = a.scheme() == b.scheme()
        && shared(
            a.authority().map(http::uri::Authority::as_str),
            b.authority().map(http::uri::Authority::as_str),
        )
        && shared(
            a.path_and_query().map(http::uri::PathAndQuery::as_str),
            b.path_and_query().map(http::uri::PathAndQuery::as_str),
        );
    clone || a == b
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Template")
            .field("uri", self.uri())
            .field(
                "extended",
                &matches!(&*self.0, TemplateInner::Extended { .. }),
            )
            .finish_non_exhaustive()
    }
}

/// A finished `reqwest::Request` as the `http::Request` a stack takes:
/// method, URI, version, headers and body move over, and the rest (the
/// parsed URL, reqwest's per-request settings) rides along as the call's
/// [`Template`], so that [`to_reqwest`] rebuilds each attempt without
/// parsing the URL again. A missing body becomes an empty one.
///
/// `timeout`: what becomes of reqwest's per-request timeout. With
/// [`ReqwestTimeout::Take`] it leaves the request and is returned (for the
/// call's deadline); with [`ReqwestTimeout::PerAttempt`] each attempt keeps
/// it, and `None` is returned.
pub(crate) fn split(
    mut request: ::reqwest::Request,
    timeout: ReqwestTimeout,
) -> Result<(HttpRequest, Option<Duration>), BoxError> {
    let url = request.url().clone();
    // The timeout's setting, the one private extension this module can
    // read, is there when there is a timeout (asking for it mutably would
    // write an empty one).
    let timeout_setting = request.timeout().is_some();
    let (taken, per_attempt) = match timeout {
        ReqwestTimeout::Take if timeout_setting => (request.timeout_mut().take(), None),
        ReqwestTimeout::Take => (None, None),
        ReqwestTimeout::PerAttempt => (None, request.timeout().copied()),
    };
    // reqwest's own conversion: the URI parsed from the URL, a missing
    // body as an empty one, and reqwest's private extensions out in the
    // open, where they can be counted.
    let (mut parts, body) = HttpRequest::try_from(request)?.into_parts();
    let own = std::mem::take(&mut parts.extensions);
    let template = if own.len() == usize::from(timeout_setting) {
        TemplateInner::Plain {
            uri: parts.uri.clone(),
            url,
            timeout: per_attempt,
        }
    } else {
        // Back into a `reqwest::Request`, settings and all (reqwest's
        // conversion parses the URL again: a request of this kind pays that
        // once per call), with the URL exactly as it was.
        let mut bare = http::Request::new(::reqwest::Body::from(Bytes::new()));
        *bare.uri_mut() = parts.uri.clone();
        *bare.extensions_mut() = own;
        let mut request = ::reqwest::Request::try_from(bare)?;
        *request.url_mut() = url;
        *request.body_mut() = None;
        TemplateInner::Extended {
            uri: parts.uri.clone(),
            request,
        }
    };
    parts.extensions.insert(Template(Arc::new(template)));
    Ok((HttpRequest::from_parts(parts, body), taken))
}

/// What [`split`] does with a request's reqwest timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReqwestTimeout {
    /// Taken out of the request and returned: [`Client`](super::Client)
    /// makes it the call's deadline, over all attempts.
    Take,
    /// Left to each attempt, as reqwest applies it (the middleware's way).
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    PerAttempt,
}

/// A stack's answer as a `reqwest::Response`, for any body the stack
/// answers with; the URL is the one the transport put in the extensions
/// ([`to_http`]).
///
/// A `reqwest::Body` is kept as it is; any other body is wrapped with
/// `reqwest::Body::wrap`, so an error it yields while the caller reads it
/// (`text()`, `bytes()`, `chunk()`) comes back as a `reqwest::Error`
/// whose `source()` chain holds the error, typed.
pub(crate) fn to_reqwest_response<B>(response: http::Response<B>) -> ::reqwest::Response
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    ::reqwest::Response::from(response.map(to_reqwest_body))
}

/// `body` as a `reqwest::Body`: unchanged when it is one (the transport's,
/// through layers that leave bodies alone), so it is not boxed twice and
/// its errors stay reqwest's own; wrapped otherwise.
fn to_reqwest_body<B>(body: B) -> ::reqwest::Body
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Some(body);
    let same = (&mut body as &mut dyn Any).downcast_mut::<Option<::reqwest::Body>>();
    if let Some(body) = same.and_then(Option::take) {
        return body;
    }
    body.map(::reqwest::Body::wrap).unwrap_or_default()
}

/// Turns one attempt into a `reqwest::Request`: through the call's
/// [`Template`] when it has one, by parsing the URI otherwise.
pub(crate) fn to_reqwest<B>(
    request: http::Request<B>,
) -> Result<::reqwest::Request, ::reqwest::Error>
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let template = parts.extensions.remove::<Template>();
    let body = (!body.is_end_stream()).then(|| ::reqwest::Body::wrap(body));
    if let Some(mut request) = template.and_then(|t| t.attempt(&mut parts)) {
        *request.body_mut() = body;
        return Ok(request);
    }
    let body = body.unwrap_or_else(|| ::reqwest::Body::from(Bytes::new()));
    ::reqwest::Request::try_from(http::Request::from_parts(parts, body))
}

/// A `reqwest::Response` as an [`HttpResponse`], keeping its URL (reqwest's
/// own conversion drops it).
pub(crate) fn to_http(response: ::reqwest::Response) -> HttpResponse {
    use ::reqwest::ResponseBuilderExt as _;
    let url = response.url().clone();
    let mut response = HttpResponse::from(response);
    // reqwest's tag for the URL can only be written by a response builder:
    // the response's own extensions (the connection's information is
    // there already) go into one for the tag and come back, so the tag
    // costs its own box and no map of its own. A builder that sets no
    // status, version or header is never in error, and gives them back.
    let mut builder = http::Response::builder();
    if let Some(extensions) = builder.extensions_mut() {
        std::mem::swap(extensions, response.extensions_mut());
    }
    let mut builder = builder.url(url);
    if let Some(extensions) = builder.extensions_mut() {
        std::mem::swap(extensions, response.extensions_mut());
    }
    response
}

impl<B> Service<http::Request<B>> for ReqwestService
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = HttpResponse;
    type Error = ::reqwest::Error;
    type Future = ResponseFuture;

    #[inline]
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // reqwest's pool never applies backpressure.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let kind = match to_reqwest(request) {
            Ok(request) => Kind::Sending {
                future: self.client.call(request),
            },
            Err(error) => Kind::Failed { error: Some(error) },
        };
        ResponseFuture { kind }
    }
}

/// reqwest's own response future, which it does not export by name.
type Pending = <::reqwest::Client as Service<::reqwest::Request>>::Future;

pin_project! {
    /// The response future of [`ReqwestService`].
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Sending { #[pin] future: Pending },
        Failed { error: Option<::reqwest::Error> },
    }
}

impl Future for ResponseFuture {
    type Output = Result<HttpResponse, ::reqwest::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Sending { future } => future.poll(cx).map_ok(to_http),
            KindProj::Failed { error } => Poll::Ready(Err(error
                .take()
                .expect("ResponseFuture polled after completion"))),
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template `split` put in `request`, and the request's parts.
    fn template_of(mut request: HttpRequest) -> (Template, http::request::Parts) {
        let template = request
            .extensions_mut()
            .remove::<Template>()
            .expect("a template");
        (template, request.map(|_| ()).into_parts().0)
    }

    fn builder(url: &str) -> ::reqwest::RequestBuilder {
        ::reqwest::Client::new().post(url).header("x-tag", "a")
    }

    /// What reqwest's builder makes carries nothing of reqwest's own: an
    /// attempt is a new request for the URL, with the call's method,
    /// version and headers, and no timeout.
    #[test]
    fn a_plain_request_is_rebuilt_from_its_url() {
        let request = builder("http://127.0.0.1:9/items?page=2")
            .version(http::Version::HTTP_2)
            .build()
            .expect("a request");
        let (template, mut parts) =
            template_of(split(request, ReqwestTimeout::PerAttempt).expect("split").0);
        assert!(!template.is_extended());
        assert_eq!(parts.uri, "http://127.0.0.1:9/items?page=2");
        let attempt = template.attempt(&mut parts).expect("the URI fits");
        assert_eq!(attempt.method(), http::Method::POST);
        assert_eq!(attempt.url().as_str(), "http://127.0.0.1:9/items?page=2");
        assert_eq!(attempt.version(), http::Version::HTTP_2);
        assert_eq!(attempt.headers()["x-tag"], "a");
        assert_eq!(attempt.timeout(), None);
    }

    /// A timeout the caller took out leaves an empty setting behind, which
    /// carries nothing: still plain.
    #[test]
    fn a_request_whose_timeout_was_taken_is_plain() {
        let request = builder("http://127.0.0.1:9/")
            .timeout(Duration::from_millis(300))
            .build()
            .expect("a request");
        let (request, taken) = split(request, ReqwestTimeout::Take).expect("split");
        assert_eq!(taken, Some(Duration::from_millis(300)));
        let (template, mut parts) = template_of(request);
        assert!(!template.is_extended());
        let attempt = template.attempt(&mut parts).expect("the URI fits");
        assert_eq!(attempt.timeout(), None);
    }

    /// A timeout left in the request (the middleware leaves reqwest's
    /// timeout to each attempt) is kept: every attempt has it, and is
    /// still rebuilt from the URL.
    #[test]
    fn a_timeout_left_in_the_request_reaches_every_attempt() {
        let request = builder("http://127.0.0.1:9/")
            .timeout(Duration::from_millis(300))
            .build()
            .expect("a request");
        let (template, parts) =
            template_of(split(request, ReqwestTimeout::PerAttempt).expect("split").0);
        assert!(!template.is_extended());
        for _ in 0..2 {
            let mut parts = clone_parts(&parts);
            let attempt = template.attempt(&mut parts).expect("the URI fits");
            assert_eq!(attempt.timeout(), Some(&Duration::from_millis(300)));
            assert_eq!(attempt.method(), http::Method::POST);
            assert_eq!(attempt.headers()["x-tag"], "a");
        }
    }

    /// Extensions of a request converted from an `http::Request` ride
    /// along with each attempt, and stay out of the stack's request.
    #[test]
    fn a_converted_requests_extensions_reach_every_attempt() {
        #[derive(Clone, Debug, PartialEq)]
        struct Marker(u32);
        let mut http = http::Request::get("http://127.0.0.1:9/x")
            .body(::reqwest::Body::from(""))
            .expect("a request");
        http.extensions_mut().insert(Marker(7));
        let mut request = ::reqwest::Request::try_from(http).expect("converted");
        *request.timeout_mut() = Some(Duration::from_millis(300));
        let (split, _) = split(request, ReqwestTimeout::PerAttempt).expect("split");
        assert_eq!(split.extensions().get::<Marker>(), None);
        let (template, mut parts) = template_of(split);
        assert!(template.is_extended());
        let attempt = template.attempt(&mut parts).expect("the URI fits");
        assert_eq!(attempt.timeout(), Some(&Duration::from_millis(300)));
        let back = http::Request::try_from(attempt).expect("converted back");
        assert_eq!(back.extensions().get::<Marker>(), Some(&Marker(7)));
    }

    /// A URI that is a clone of the template's fits at once; one parsed
    /// again from the same text fits too; another does not.
    #[test]
    fn the_same_uri_is_told_by_its_bytes_or_its_text() {
        let uri =
            http::Uri::from_maybe_shared(Bytes::from("http://127.0.0.1:9/a?b=1")).expect("a URI");
        assert!(same_uri(&uri.clone(), &uri));
        let parsed: http::Uri = "http://127.0.0.1:9/a?b=1".parse().expect("a URI");
        assert!(same_uri(&parsed, &uri));
        for other in [
            "https://127.0.0.1:9/a?b=1",
            "http://127.0.0.1:8/a?b=1",
            "http://127.0.0.1:9/a?b=2",
            "/a?b=1",
        ] {
            let other: http::Uri = other.parse().expect("a URI");
            assert!(!same_uri(&other, &uri), "{other}");
            assert!(!same_uri(&uri, &other), "{other}");
        }
    }

    /// A layer that changed the URI gets no template's request: the
    /// attempt is parsed from its URI instead.
    #[test]
    fn a_changed_uri_does_not_fit_the_template() {
        let request = builder("http://127.0.0.1:9/a").build().expect("a request");
        let (template, mut parts) =
            template_of(split(request, ReqwestTimeout::PerAttempt).expect("split").0);
        parts.uri = http::Uri::from_static("http://127.0.0.1:9/b");
        assert!(template.attempt(&mut parts).is_none());
    }

    fn clone_parts(parts: &http::request::Parts) -> http::request::Parts {
        let mut copy = http::Request::new(()).into_parts().0;
        copy.method = parts.method.clone();
        copy.uri = parts.uri.clone();
        copy.version = parts.version;
        copy.headers = parts.headers.clone();
        copy
    }
}
