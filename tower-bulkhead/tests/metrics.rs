//! The `metrics` feature: calls in flight and rejections, labelled with the
//! compartment's name (never a key's); read back from the Prometheus
//! exporter's page, as a scrape would.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::{metrics, BulkheadLayer};

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

async fn slow(_req: Request<&'static str>) -> Result<Response<()>, Infallible> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Response::new(()))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn full_compartment_counts_rejections_and_in_flight_follows_permits() {
    let (recorder, page) = exporter();
    let mut service = ::metrics::with_local_recorder(&recorder, || {
        BulkheadLayer::new("search", 1).layer(service_fn(slow))
    });
    let label = [("compartment", "search")];
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 0.0);

    service.ready().await.unwrap();
    let first = service.call(Request::new(""));
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 1.0);

    let error = service.clone().oneshot(Request::new("")).await.unwrap_err();
    assert!(error.is::<BulkheadFull>());
    assert_eq!(sample(&page, metrics::REJECTIONS, &label), 1.0);
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 1.0);

    first.await.unwrap();
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 0.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn keyed_compartments_record_under_the_layer_name_not_the_key() {
    let (recorder, page) = exporter();
    let mut service = ::metrics::with_local_recorder(&recorder, || {
        BulkheadLayer::new("tenants", 1)
            .per_key(|req: &Request<&'static str>| *req.body())
            .layer(service_fn(slow))
    });
    let label = [("compartment", "tenants")];

    service.ready().await.unwrap();
    let a = service.call(Request::new("a"));
    service.ready().await.unwrap();
    let b = service.call(Request::new("b"));
    let error = service
        .clone()
        .oneshot(Request::new("a"))
        .await
        .unwrap_err();
    assert!(error.is::<BulkheadFull>());

    // Summed over the keys, which never become label values; the
    // fallback compartment has its own series.
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 2.0);
    assert_eq!(sample(&page, metrics::REJECTIONS, &label), 1.0);
    let fallback = [("compartment", "tenants/fallback")];
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &fallback), 0.0);
    let rendered = page.render();
    assert!(
        !rendered.contains("tenants[")
            && !rendered.contains("\"a\"")
            && !rendered.contains("\"b\"")
    );

    drop(a);
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 1.0);
    b.await.unwrap();
    assert_eq!(sample(&page, metrics::IN_FLIGHT, &label), 0.0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_limit_gauge_is_set_at_creation_and_follows_an_adaptive_limit() {
    let (recorder, page) = exporter();
    let (fixed, adaptive) = ::metrics::with_local_recorder(&recorder, || {
        let fixed = BulkheadLayer::new("fixed", 7);
        let adaptive = BulkheadLayer::adaptive(
            "learning",
            tower_bulkhead::adaptive::Aimd::new().initial(10),
        );
        (fixed, adaptive)
    });
    assert_eq!(
        sample(&page, metrics::LIMIT, &[("compartment", "fixed")]),
        7.0
    );
    let label = [("compartment", "learning")];
    assert_eq!(sample(&page, metrics::LIMIT, &label), 10.0);

    // Ten calls cut by their callers close a window: the limit and the
    // gauge come down together.
    let handle = adaptive.handle();
    let service = adaptive.layer(service_fn(slow));
    tokio::time::advance(Duration::from_millis(20)).await;
    let cuts: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn(tokio::time::timeout(
                Duration::from_millis(5),
                service.clone().oneshot(Request::new("")),
            ))
        })
        .collect();
    for cut in cuts {
        assert!(cut.await.unwrap().is_err());
    }
    assert_eq!(handle.limit(), 9);
    assert_eq!(sample(&page, metrics::LIMIT, &label), 9.0);
    drop(fixed);
}
