//! The attempt hook survives a `map_response` between the breaker and the
//! retry layer: it judges each attempt by its status and headers, so every
//! attempt is still counted; a classifier that only knows the breaker's own
//! response type falls back to the default rules, with one warning.

mod support;

use std::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::{Request, Response};
use support::*;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_breaker::classify::classify_fn;
use tower_breaker::classify::{classify_error, default_outcome};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{BreakerLayer, State};

/// The message the breaker's hook logs when it reports responses of
/// another type than its classifier judges.
const MISMATCH: &str = "circuit_hook_type_mismatch";

/// The body length: what the `map_response` between the layers makes of
/// each response.
fn body_len(response: Response<String>) -> Response<usize> {
    response.map(|body| body.len())
}

async fn send_mapped<S, B>(svc: &S) -> Result<Response<B>, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
{
    svc.clone().oneshot(Request::new(String::new())).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_map_response_between_breaker_and_retry_still_counts_every_attempt() {
    let warnings = Events::default();
    let _guard = resilience_testkit::set_default(warnings.clone());
    let breaker = counted(4);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()))
        .map_response(body_len)
        .layer(retry())
        .service(answering(&calls, 503));

    let first = send_mapped(&client).await.unwrap();
    assert_eq!(first.status(), 503);
    assert_eq!(calls.calls(), 3);
    let s = breaker.snapshot();
    assert_eq!(
        (s.window.calls, s.window.failures),
        (3, 3),
        "three attempts, three failures: the hook reached the retry layer"
    );
    assert_eq!(s.state, State::Closed);

    // The first attempt of the second call is the 4th failure: the circuit
    // opens during the call and the retry loop stops with the breaker's
    // error instead of retrying.
    let err = send_mapped(&client).await.unwrap_err();
    let open = err
        .downcast_ref::<CircuitOpen>()
        .unwrap_or_else(|| panic!("not the breaker's error: {err:?}"));
    assert_eq!(open.breaker(), "dependency");
    assert_eq!(calls.calls(), 4, "no retry once the circuit opened");
    let s = breaker.snapshot();
    assert_eq!(s.state, State::Open);
    assert_eq!(s.totals.failed, 4);
    assert_eq!(s.totals.rejected, 1, "the refused retry");

    // The default classifier judges status and headers: no type to mismatch.
    assert_eq!(warnings.mentioning(MISMATCH), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_classifier_of_the_mapped_type_falls_back_to_the_default_rules_and_warns_once() {
    let warnings = Events::default();
    let _guard = resilience_testkit::set_default(warnings.clone());
    // Only judges `Response<usize>`, the breaker's own response type; the
    // retry layer below reports `Response<String>`.
    let judged = Arc::new(AtomicUsize::new(0));
    let classifier = classify_fn({
        let judged = judged.clone();
        move |result: Result<&Response<usize>, &(dyn Error + 'static)>| match result {
            Ok(response) => {
                judged.fetch_add(1, Ordering::SeqCst);
                default_outcome(response.status(), response.headers())
            }
            Err(e) => classify_error(e),
        }
    });
    let breaker = counted(10);
    let calls = CallCounter::default();
    let client = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker.clone()).classifier(classifier))
        .map_response(body_len)
        .layer(retry())
        .service(answering(&calls, 503));

    for n in 1..=2 {
        let response = send_mapped(&client).await.unwrap();
        assert_eq!(response.status(), 503);
        let s = breaker.snapshot();
        assert_eq!(
            (s.window.calls, s.window.failures),
            (3 * n, 3 * n),
            "call {n}: every attempt counted, by the default rules"
        );
    }
    assert_eq!(calls.calls(), 6);
    assert_eq!(breaker.snapshot().totals.failed, 6);
    assert_eq!(
        judged.load(Ordering::SeqCst),
        0,
        "the classifier cannot see the retry layer's responses"
    );
    assert_eq!(
        warnings.mentioning(MISMATCH),
        1,
        "one warning for six mismatched attempts over two calls"
    );
    assert_eq!(breaker.snapshot().state, State::Closed);
}
