//! What counts as accepted: the default classifier of HTTP responses.

use http::{HeaderMap, Response, StatusCode};
use tower_resilience_base::answer::is_local_answer;
use tower_resilience_base::classify::{self as shared, Class};
use tower_resilience_base::grpc::GrpcCode;
use tower_resilience_base::outcome::{Classify, Outcome};

/// The default classifier of a [`Throttle`](super::Throttle): the
/// breaker's [`DefaultClassifier`](crate::DefaultClassifier) (the
/// toolkit's one classification: `5xx`, the gRPC statuses of a failing
/// server and transport errors are failures; other answers are accepted;
/// local answers and local rejections from below are ignored), except that
/// an answer by which the dependency **refuses work to shed load** is not
/// an accept: `429 Too Many Requests` and gRPC `RESOURCE_EXHAUSTED`.
///
/// That is the SRE book's "accepted": the breaker counts a 429 as a
/// success (the dependency is healthy and says so), the throttle counts it
/// as a request the dependency did not accept, which is what the rule is
/// about. Any other [`Classify`] works too: give the throttle the
/// breaker's classifier to have both judge alike.
///
/// # Example
///
/// ```
/// use tower_breaker::throttle::ThrottleClassifier;
/// use tower_breaker::{Classify, DefaultClassifier, Outcome};
///
/// let response = |status: u16| http::Response::builder().status(status).body(()).unwrap();
/// assert_eq!(ThrottleClassifier.classify_response(&response(200)), Outcome::Success);
/// assert_eq!(ThrottleClassifier.classify_response(&response(404)), Outcome::Success);
/// assert_eq!(ThrottleClassifier.classify_response(&response(503)), Outcome::Failure);
/// assert_eq!(ThrottleClassifier.classify_response(&response(429)), Outcome::Failure);
/// // The breaker's view of a 429:
/// assert_eq!(DefaultClassifier.classify_response(&response(429)), Outcome::Success);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ThrottleClassifier;

fn outcome(class: Class, headers: Option<&HeaderMap>) -> Outcome {
    match class {
        Class::Throttled { .. } => Outcome::Failure,
        Class::Rejected
            if headers.is_some_and(|h| {
                GrpcCode::from_headers(h) == Some(GrpcCode::ResourceExhausted)
            }) =>
        {
            Outcome::Failure
        }
        other => Outcome::from(other),
    }
}

impl<B> Classify<Response<B>> for ThrottleClassifier {
    #[inline]
    fn classify_response(&self, response: &Response<B>) -> Outcome {
        if is_local_answer(response) {
            return Outcome::Ignored;
        }
        let (status, headers) = (response.status(), response.headers());
        outcome(shared::classify_response(status, headers), Some(headers))
    }

    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
        Some(outcome(
            shared::classify_response(status, headers),
            Some(headers),
        ))
    }

    fn classify_class(&self, class: Class) -> Option<Outcome> {
        Some(outcome(class, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_exhausted_is_not_accepted_and_other_grpc_refusals_are() {
        let grpc = |code: &'static str| {
            Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", code)
                .body(())
                .unwrap()
        };
        assert_eq!(
            ThrottleClassifier.classify_response(&grpc("8")),
            Outcome::Failure
        );
        assert_eq!(
            ThrottleClassifier.classify_response(&grpc("5")),
            Outcome::Success
        );
        assert_eq!(
            ThrottleClassifier.classify_response(&grpc("14")),
            Outcome::Failure
        );
        assert_eq!(
            ThrottleClassifier.classify_response(&grpc("0")),
            Outcome::Success
        );
    }
}
