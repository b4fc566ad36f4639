//! How a fallback answer is marked.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Response};

use crate::cause::Cause;

/// `x-tower-fallback`: the header on an HTTP response served by a
/// [`FallbackLayer`](super::FallbackLayer) instead of the dependency's own
/// answer. Its value is the [`Cause`] in kebab case
/// ([`Cause::as_str`]): `circuit-open`, `bulkhead-full`,
/// `local-rejection`, `deadline-exceeded`, `retries-exhausted`,
/// `budget-exhausted`, `failure`, or `exercise` for an answer served on
/// purpose by the exercise mode.
///
/// Turn it off with [`FallbackLayer::header`](super::FallbackLayer::header)
/// (the [`FallbackServed`] extension stays), for example when the answer
/// leaves your system and its callers should not learn how it was made.
pub const FALLBACK_HEADER: HeaderName = HeaderName::from_static("x-tower-fallback");

/// `x-tower-fallback-age`: on a fallback answer taken from a
/// [last-good cache](super::Fallback::last_good), how long ago the
/// dependency gave it, in whole seconds (rounded down). Sent with
/// [`FALLBACK_HEADER`], and turned off with it.
pub const FALLBACK_AGE_HEADER: HeaderName = HeaderName::from_static("x-tower-fallback-age");

/// The mark of an answer served by a fallback: why, and how stale.
///
/// The HTTP flavour of [`FallbackLayer`](super::FallbackLayer) puts it in
/// the response's extensions (with the [`FALLBACK_HEADER`]); for other
/// responses, [`FallbackLayer::mark_with`](super::FallbackLayer::mark_with)
/// receives it, to record it in your own response type. Counters by cause
/// are in the layer's [snapshot](super::FallbackLayer::snapshot).
///
/// # Example
///
/// ```
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
/// use tower_degrade::{Cause, Fallback, FallbackLayer, FallbackServed};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let down = service_fn(|_req: http::Request<()>| async {
///     Err::<http::Response<&str>, BoxError>("connection refused".into())
/// });
/// let client = FallbackLayer::new(Fallback::value(http::Response::new("[]"))).layer(down);
///
/// let response = client.oneshot(http::Request::new(())).await.unwrap();
/// let served = response.extensions().get::<FallbackServed>().unwrap();
/// assert_eq!(served.cause(), Cause::Failure);
/// assert_eq!(served.stale_for(), None);
/// assert_eq!(response.headers()["x-tower-fallback"], "failure");
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackServed {
    cause: Cause,
    stale_for: Option<Duration>,
}

// === impl FallbackServed ===

impl FallbackServed {
    pub(crate) const fn new(cause: Cause, stale_for: Option<Duration>) -> Self {
        Self { cause, stale_for }
    }

    /// Why the fallback answered.
    #[must_use]
    pub const fn cause(&self) -> Cause {
        self.cause
    }

    /// For an answer from a [last-good cache](super::Fallback::last_good):
    /// how long ago the dependency gave it. `None` for other fallbacks.
    #[must_use]
    pub const fn stale_for(&self) -> Option<Duration> {
        self.stale_for
    }

    /// Whether the answer was served on purpose by the exercise mode,
    /// rather than for a failure.
    #[must_use]
    pub fn is_exercise(&self) -> bool {
        self.cause == Cause::Exercise
    }
}

/// The HTTP flavour's mark: the extension, and the headers when `header`.
pub(crate) fn mark_http<B>(response: &mut Response<B>, served: &FallbackServed, header: bool) {
    response.extensions_mut().insert(*served);
    if header {
        let headers = response.headers_mut();
        headers.insert(FALLBACK_HEADER, served.cause.header_value());
        if let Some(age) = served.stale_for {
            headers.insert(FALLBACK_AGE_HEADER, seconds(age));
        }
    }
}

/// Whole seconds, rounded down; small values need no allocation.
fn seconds(age: Duration) -> HeaderValue {
    const SMALL: [&str; 11] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
    let secs = age.as_secs();
    match SMALL.get(secs as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_extension_and_headers() {
        let mut r = Response::new(());
        let served = FallbackServed::new(Cause::Failure, Some(Duration::from_millis(12_900)));
        mark_http(&mut r, &served, true);
        assert_eq!(r.extensions().get::<FallbackServed>(), Some(&served));
        assert_eq!(r.headers()[FALLBACK_HEADER], "failure");
        assert_eq!(r.headers()[FALLBACK_AGE_HEADER], "12");

        let mut r = Response::new(());
        mark_http(
            &mut r,
            &FallbackServed::new(Cause::CircuitOpen, None),
            false,
        );
        assert!(r.headers().is_empty());
        assert!(r.extensions().get::<FallbackServed>().is_some());
    }
}
