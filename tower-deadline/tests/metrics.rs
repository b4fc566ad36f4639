//! The `metrics` feature: each documented metric is recorded, with the
//! layer's name as its label, by the event it names; read back from the
//! Prometheus exporter's page, as a scrape would.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tower::{service_fn, Layer, ServiceExt};
use tower_deadline::error::{DeadlineExceeded, InsufficientBudget};
use tower_deadline::{
    metrics, ClientDeadlineLayer, Deadline, ServerDeadlineLayer, DEFAULT_HTTP_HEADER,
};

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

async fn slow(_req: Request<()>) -> Result<Response<()>, Infallible> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Response::new(()))
}

fn with_budget(ms: &str) -> Request<()> {
    Request::builder()
        .header(DEFAULT_HTTP_HEADER, ms)
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn server_records_budgets_received_expiries_and_fail_fast_rejections() {
    let (recorder, page) = exporter();
    let service = ::metrics::with_local_recorder(&recorder, || {
        ServerDeadlineLayer::new()
            .name("checkout")
            .min_remaining(Duration::from_millis(10))
            .layer(service_fn(slow))
    });
    let label = [("service", "checkout")];
    let received = |suffix: &str| sample(&page, &format!("{}{suffix}", metrics::RECEIVED), &label);

    // A 100 ms budget against a 1 s handler: cut off.
    let response = service.clone().oneshot(with_budget("100")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(sample(&page, metrics::SERVER_EXPIRED, &label), 1.0);
    assert_eq!(sample(&page, metrics::SERVER_REJECTED, &label), 0.0);
    assert_eq!(received("_count"), 1.0);

    // A 5 ms budget, under the 10 ms minimum: failed fast.
    let response = service.clone().oneshot(with_budget("5")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(sample(&page, metrics::SERVER_REJECTED, &label), 1.0);
    assert_eq!(sample(&page, metrics::SERVER_EXPIRED, &label), 1.0);
    // Both budgets were received, in seconds, before any clamping.
    assert_eq!(received("_count"), 2.0);
    assert!((received("_sum") - 0.105).abs() < 1e-9);

    // No budget sent and no default: nothing received, nothing counted.
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(received("_count"), 2.0);
    assert_eq!(sample(&page, metrics::SERVER_EXPIRED, &label), 1.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn client_records_expiries_and_refusals_under_its_dependency_name() {
    let (recorder, page) = exporter();
    let service = ::metrics::with_local_recorder(&recorder, || {
        ClientDeadlineLayer::new()
            .name("inventory")
            .min_remaining(Duration::from_millis(10))
            .layer(service_fn(slow))
    });
    let label = [("dependency", "inventory")];

    let mut request = Request::new(());
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(50)));
    let error = service.clone().oneshot(request).await.unwrap_err();
    assert!(error.is::<DeadlineExceeded>());
    assert_eq!(sample(&page, metrics::CLIENT_EXPIRED, &label), 1.0);
    assert_eq!(sample(&page, metrics::CLIENT_REJECTED, &label), 0.0);

    let mut request = Request::new(());
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(5)));
    let error = service.oneshot(request).await.unwrap_err();
    assert!(error.is::<InsufficientBudget>());
    assert_eq!(sample(&page, metrics::CLIENT_REJECTED, &label), 1.0);
    assert_eq!(sample(&page, metrics::CLIENT_EXPIRED, &label), 1.0);
}
