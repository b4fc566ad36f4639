//! Finding a typed error in a chain of sources.

use std::error::Error as StdError;

/// Finds the first error of type `E` in `error` or its `source()` chain.
///
/// A layer's error that reaches the caller inside another error is found
/// here: a `DeadlineExceeded` or any error the stack's response body
/// yields while `text()`, `bytes()` or `chunk()` reads it (reqwest wraps
/// it in a `reqwest::Error`, twice: a decode error around a body error),
/// the last attempt's `reqwest::Error` under a retry layer's give-up
/// (`AttemptsExhausted`, `BudgetExhausted`), or an `std::io::Error` deep
/// under a `reqwest::Error`. For the errors of a
/// `reqwest_middleware::ClientWithMiddleware`, use `downcast_error`
/// (feature `reqwest-middleware`), which also looks inside
/// `reqwest_middleware::Error`.
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use tower::service_fn;
/// use tower_shield::reqwest::{find_error, Client, HttpRequest};
/// use tower_deadline::error::DeadlineExceeded;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_breaker::BoxError> {
/// // A stack whose answer's body fails once it is read.
/// let stack = service_fn(|_: HttpRequest| async {
///     let frames = vec![Err::<http_body::Frame<bytes::Bytes>, _>(DeadlineExceeded::new())];
///     let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
///     Ok::<_, Infallible>(http::Response::new(body))
/// });
/// let client = Client::from_parts(reqwest::Client::new(), stack);
/// let response = client.get("http://127.0.0.1:3000/items").send().await?;
///
/// let err = response.text().await.unwrap_err(); // a `reqwest::Error`
/// assert!(err.is_decode());
/// assert!(find_error::<DeadlineExceeded>(&err).is_some());
/// assert!(find_error::<std::io::Error>(&err).is_none());
/// # Ok(())
/// # }
/// ```
#[must_use]
pub fn find_error<'a, E>(error: &'a (dyn StdError + 'static)) -> Option<&'a E>
where
    E: StdError + 'static,
{
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}
