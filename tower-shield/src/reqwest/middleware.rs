//! The client stack as one `reqwest_middleware::Middleware`.

use std::error::Error as StdError;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tower_bulkhead::release::BodyEnd;
use tower_layer::Layer;
use tower_retry_budget::body::{Buffered, ReplayBody};
use tower_retry_budget::policy::Policy;
use tower_retry_budget::DefaultPolicy;
use tower_service::Service;

use super::service::{
    split, to_http, to_reqwest, to_reqwest_response, HttpResponse, ReqwestTimeout,
};
use crate::stack::{ClientStack, OptionalThrottle, ThrottleSlot};
use crate::BoxError;

/// A [`ClientStack`] as one `reqwest_middleware::Middleware`: deadline,
/// breaker, retries and bulkhead for every request of a
/// `reqwest_middleware::ClientWithMiddleware`.
///
/// Each request goes through the whole stack inside this middleware; each
/// attempt the retry layer makes runs the rest of the chain (the
/// middlewares after this one, then the client), so the breaker counts
/// every attempt and the retry layer replays the body it recorded (up to
/// 64 KiB; a larger body is sent once). Middlewares before this one see
/// one call; those after it see every attempt, each with a clone of the
/// request's middleware extensions (what they add to them is not passed
/// back). See the [module docs](super) for where to put it and when to
/// prefer [`Client`](super::Client). Built for reqwest-middleware 0.5
/// (reqwest 0.13).
///
/// reqwest-middleware's `RequestBuilder::timeout` stays reqwest's own
/// per-request timeout: reqwest applies it to each attempt separately
/// (from the start of the attempt to the end of its body), and the stack
/// sees an attempt it cuts as a failed one (reqwest's timeout error, which
/// the retry layer does not retry). For a budget
/// of the whole call, retries included, set the stack's `timeout`, or send
/// inside a `tower_deadline::Deadline::scope`.
///
/// The stack's answer becomes the `reqwest::Response` the chain returns
/// whatever its body type (the same conversion, with the same bounds, as
/// [`RequestBuilder::send`](super::RequestBuilder::send)): an error the
/// body yields while it is read comes back as a `reqwest::Error` with the
/// typed error in its `source()` chain, for
/// [`find_error`](super::find_error).
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use tower_shield::reqwest::{ReqwestService, StackMiddleware};
/// use tower_shield::stack::client_stack;
///
/// # async fn run() -> Result<(), tower_breaker::BoxError> {
/// let stack = client_stack("catalog").timeout(Duration::from_secs(2));
/// // reqwest's own retries off, as for `Client` (see the module docs).
/// let transport = ReqwestService::client_builder().build()?;
/// let client = reqwest_middleware::ClientBuilder::new(transport)
///     .with(StackMiddleware::new(stack))
///     .build();
/// let response = client.get("http://127.0.0.1:3000/items").send().await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// An error of the last attempt that the stack returns as it was (one the
/// retry layer does not retry) comes back unchanged:
/// `reqwest_middleware::Error::Reqwest` for reqwest's, the inner
/// middlewares' errors as they were. The layers' own errors are
/// `reqwest_middleware::Error::Middleware`: `CircuitOpen`, `BulkheadFull`,
/// `DeadlineExceeded`, and the retry layer's give-ups
/// (`AttemptsExhausted`, `BudgetExhausted`, with the last attempt's error
/// as their source). A give-up stays wrapped on purpose: it says the
/// retries were spent here, and retry middlewares above do not retry a
/// `Middleware` error. Find any of them with
/// [`downcast_error`](super::downcast_error).
///
/// # Clone
///
/// Clones share the stack's breaker, budget and compartment.
#[derive(Clone)]
pub struct StackMiddleware<P = DefaultPolicy> {
    stack: ClientStack<P, Buffered, BodyEnd, OptionalThrottle>,
}

impl<P> StackMiddleware<P> {
    /// The middleware for `stack`. Build it once per dependency: the stack
    /// holds the breaker's and the budget's shared state.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_shield::reqwest::StackMiddleware;
    /// use tower_shield::stack::client_stack;
    ///
    /// let stack = client_stack("catalog");
    /// let breaker = stack.breaker_handle().clone();
    /// let middleware = StackMiddleware::new(stack);
    /// # let _ = (breaker, middleware);
    /// ```
    pub fn new<T: ThrottleSlot>(stack: ClientStack<P, Buffered, BodyEnd, T>) -> Self {
        Self {
            stack: stack.into_optional_throttle(),
        }
    }

    /// The stack, for its breaker and retry counters (its throttle, if any,
    /// as an [`OptionalThrottle`]).
    pub fn stack(&self) -> &ClientStack<P, Buffered, BodyEnd, OptionalThrottle> {
        &self.stack
    }
}

impl<P> fmt::Debug for StackMiddleware<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackMiddleware")
            .field("breaker", &self.stack.breaker_handle().name())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<P> Middleware for StackMiddleware<P>
where
    P: Policy + Clone + Send + Sync + 'static,
{
    async fn handle(
        &self,
        request: ::reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<::reqwest::Response> {
        // The URL, parsed, and reqwest's per-request settings (its timeout,
        // applied to each attempt) travel in the call's template.
        let (request, _) =
            split(request, ReqwestTimeout::PerAttempt).map_err(to_middleware_error)?;
        let transport = NextService {
            next,
            extensions: extensions.clone(),
        };
        let mut service = self.stack.layer(transport);
        let answer = async {
            poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(request).await
        };
        match answer.await {
            Ok(response) => Ok(to_reqwest_response(response)),
            Err(e) => Err(to_middleware_error(e)),
        }
    }
}

/// A layer's error as the middleware's: reqwest's and the inner
/// middlewares' errors unchanged, the others boxed in `Middleware`.
fn to_middleware_error(error: BoxError) -> reqwest_middleware::Error {
    let error = match error.downcast::<reqwest_middleware::Error>() {
        Ok(error) => return *error,
        Err(error) => error,
    };
    match error.downcast::<::reqwest::Error>() {
        Ok(error) => reqwest_middleware::Error::Reqwest(*error),
        Err(error) => reqwest_middleware::Error::Middleware(anyhow::Error::from_boxed(error)),
    }
}

/// Finds the first error of type `E` in a `reqwest_middleware::Error` or
/// its `source()` chain: a layer's error
/// ([`CircuitOpen`](tower_breaker::error::CircuitOpen), `BulkheadFull`,
/// `DeadlineExceeded`, the retry layer's `AttemptsExhausted`, ...) that
/// [`StackMiddleware`] returned, or the `reqwest::Error` of the last
/// attempt beneath it. Plain `anyhow::Error::downcast_ref` does not see
/// through the box the stack's errors travel in.
///
/// # Example
///
/// ```no_run
/// use tower_breaker::error::CircuitOpen;
/// use tower_shield::reqwest::{downcast_error, StackMiddleware};
/// use tower_shield::stack::client_stack;
///
/// # async fn run() {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(StackMiddleware::new(client_stack("catalog")))
///     .build();
/// match client.get("http://127.0.0.1:3000/items").send().await {
///     Ok(response) => println!("{}", response.status()),
///     Err(e) => match downcast_error::<CircuitOpen>(&e) {
///         Some(open) => println!("{} is open, retry in {:?}", open.breaker(), open.retry_after()),
///         None => println!("failed: {e}"),
///     },
/// }
/// # }
/// ```
#[must_use]
pub fn downcast_error<E>(error: &reqwest_middleware::Error) -> Option<&E>
where
    E: StdError + 'static,
{
    let top: &(dyn StdError + 'static) = match error {
        reqwest_middleware::Error::Middleware(e) => match e.downcast_ref::<BoxError>() {
            Some(boxed) => &**boxed,
            None => e.as_ref(),
        },
        reqwest_middleware::Error::Reqwest(e) => e,
    };
    let mut next = Some(top);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        // The chain's own middleware errors (the last attempt's, under a
        // give-up) are transparent: their `source()` skips what they hold.
        if let Some(inner) = e.downcast_ref::<reqwest_middleware::Error>() {
            return downcast_error(inner);
        }
        next = e.source();
    }
    None
}

/// The rest of the middleware chain as the transport of the stack: each
/// attempt runs the middlewares after ours and the client.
#[derive(Clone)]
struct NextService<'a> {
    next: Next<'a>,
    extensions: Extensions,
}

impl<'a> Service<http::Request<ReplayBody<::reqwest::Body>>> for NextService<'a> {
    type Response = HttpResponse;
    type Error = reqwest_middleware::Error;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Self::Error>> + Send + 'a>>;

    #[inline]
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReplayBody<::reqwest::Body>>) -> Self::Future {
        let next = self.next.clone();
        let mut extensions = self.extensions.clone();
        let request = to_reqwest(request);
        Box::pin(async move {
            let response = next.run(request?, &mut extensions).await?;
            Ok(to_http(response))
        })
    }
}
