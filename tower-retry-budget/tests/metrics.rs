//! The `metrics` feature: retries, budget refusals, do-not-retry stops and
//! hedges, labelled with the layer's dependency name.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::{metrics, RetryBudget, RetryLayer, NO_RETRY_HEADER};

/// A Prometheus recorder, and how to read one sample of what it would
/// serve to a scrape (reading does not reset anything).
fn exporter() -> (PrometheusRecorder, PrometheusHandle) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    (recorder, handle)
}

/// The value of the sample `name{labels}` (exactly these labels) on the
/// exporter's page; panics with the page when it is missing.
fn sample(handle: &PrometheusHandle, name: &str, labels: &[(&str, &str)]) -> f64 {
    let page = handle.render();
    let mut wanted = labels.to_vec();
    wanted.sort_unstable();
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let mut found: Vec<(&str, &str)> = rest
                .strip_suffix('}')?
                .split(',')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            found.sort_unstable();
            (metric == name && found == wanted).then(|| value.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{page}"))
}

fn unavailable(marked: bool) -> Response<String> {
    let mut response = Response::new(String::new());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    if marked {
        response
            .headers_mut()
            .insert(NO_RETRY_HEADER, HeaderValue::from_static("1"));
    }
    response
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retries_sent_are_counted_per_dependency() {
    let (recorder, page) = exporter();
    let service = ::metrics::with_local_recorder(&recorder, || {
        RetryLayer::new()
            .name("inventory")
            .no_budget()
            .layer(service_fn(|_: Request<ReplayBody<String>>| async {
                Ok::<_, Infallible>(unavailable(false))
            }))
    });

    let response = service.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let label = [("dependency", "inventory")];
    // Three attempts: two retries.
    assert_eq!(sample(&page, metrics::RETRIES, &label), 2.0);
    let refused = [("dependency", "inventory"), ("kind", "retry")];
    assert_eq!(sample(&page, metrics::BUDGET_REFUSALS, &refused), 0.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_the_budget_refuses_is_counted_and_not_sent() {
    let (recorder, page) = exporter();
    // No floor: one request earns a tenth of a retry, not a whole one.
    let budget = Arc::new(RetryBudget::new().min_per_sec(0));
    let service = ::metrics::with_local_recorder(&recorder, || {
        RetryLayer::new()
            .name("billing")
            .budget(budget)
            .layer(service_fn(|_: Request<ReplayBody<String>>| async {
                Ok::<_, Infallible>(unavailable(false))
            }))
    });

    service.oneshot(Request::new(String::new())).await.unwrap();
    let refused = [("dependency", "billing"), ("kind", "retry")];
    assert_eq!(sample(&page, metrics::BUDGET_REFUSALS, &refused), 1.0);
    assert_eq!(
        sample(&page, metrics::RETRIES, &[("dependency", "billing")]),
        0.0
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failure_marked_below_counts_as_a_do_not_retry_stop() {
    let (recorder, page) = exporter();
    let service = ::metrics::with_local_recorder(&recorder, || {
        RetryLayer::new()
            .name("ledger")
            .no_budget()
            .layer(service_fn(|_: Request<ReplayBody<String>>| async {
                Ok::<_, Infallible>(unavailable(true))
            }))
    });

    service.oneshot(Request::new(String::new())).await.unwrap();
    let label = [("dependency", "ledger")];
    assert_eq!(sample(&page, metrics::DO_NOT_RETRY, &label), 1.0);
    assert_eq!(sample(&page, metrics::RETRIES, &label), 0.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hedges_sent_and_won_are_counted() {
    let (recorder, page) = exporter();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = ::metrics::with_local_recorder(&recorder, || {
        HedgeLayer::new()
            .name("search")
            .fixed_delay(Duration::from_millis(10))
            .no_budget()
            .layer(service_fn(move |_: Request<ReplayBody<String>>| {
                // The first attempt is slow; the hedge answers at once.
                let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok::<_, Infallible>(Response::new(String::new()))
                }
            }))
    });

    let response = service.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let label = [("dependency", "search")];
    assert_eq!(sample(&page, metrics::HEDGES, &label), 1.0);
    assert_eq!(sample(&page, metrics::HEDGES_WON, &label), 1.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hedge_the_budget_refuses_is_counted_as_kind_hedge() {
    let (recorder, page) = exporter();
    let service = ::metrics::with_local_recorder(&recorder, || {
        HedgeLayer::new()
            .name("profile")
            .fixed_delay(Duration::from_millis(10))
            .budget(Arc::new(RetryBudget::new().min_per_sec(0)))
            .layer(service_fn(|_: Request<ReplayBody<String>>| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }))
    });

    service.oneshot(Request::new(String::new())).await.unwrap();
    let refused = [("dependency", "profile"), ("kind", "hedge")];
    assert_eq!(sample(&page, metrics::BUDGET_REFUSALS, &refused), 1.0);
    assert_eq!(
        sample(&page, metrics::HEDGES, &[("dependency", "profile")]),
        0.0
    );
}
