//! The `metrics` feature end to end: a short outage through the client
//! stack (a full bulkhead, an expired deadline, retries, a breaker that
//! opens and rejects), recorded by the Prometheus exporter and read back in
//! its text format, as a scrape would.
//!
//! One test per binary: the exporter is installed as the global recorder.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::{metrics, Breaker, BreakerConfig, BreakerLayer, State};
use tower_bulkhead::error::BulkheadFull;
use tower_bulkhead::BulkheadLayer;
use tower_deadline::error::DeadlineExceeded;
use tower_deadline::ClientDeadlineLayer;
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::RetryLayer;

const NAME: &str = "inventory";

/// The value of the sample `name{labels}` in a Prometheus text page.
fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let rest = rest.strip_suffix('}')?;
            let mut found: Vec<(&str, &str)> = rest
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            found.sort_unstable();
            let mut wanted = labels.to_vec();
            wanted.sort_unstable();
            (found == wanted).then(|| value.parse().ok())?
        })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn outage_through_the_stack_shows_every_documented_metric_on_the_exporter() {
    let exporter = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");

    // The dependency: the first call hangs, then it is down (503).
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = calls.clone();
        service_fn(move |_req: Request<ReplayBody<String>>| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                let mut response = Response::new(String::new());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, Infallible>(response)
            }
        })
    };
    let breaker = Breaker::with_config(
        NAME,
        BreakerConfig::new()
            .count_window(4)
            .minimum_calls(4)
            .open_period(Duration::from_secs(30)),
    );
    let mut stack = ServiceBuilder::new()
        .layer(
            ClientDeadlineLayer::new()
                .name(NAME)
                .default_timeout(Duration::from_millis(500))
                .enforce_only(),
        )
        .layer(BreakerLayer::new(breaker.clone()))
        .layer(RetryLayer::new().name(NAME).no_budget())
        .layer(BulkheadLayer::new(NAME, 1))
        .layer(ClientDeadlineLayer::new().name(NAME))
        .service(inner);

    // 1. The hanging call holds the bulkhead's only slot...
    stack.ready().await.unwrap();
    let hanging = tokio::spawn(stack.call(Request::new(String::new())));
    tokio::task::yield_now().await;
    // ...so the next one is rejected as local overload (not the
    // dependency's fault: the breaker ignores it).
    let full = stack.clone().oneshot(Request::new(String::new())).await;
    assert!(full.unwrap_err().is::<BulkheadFull>());
    // 2. The hanging call runs out of its 500 ms.
    let expired = hanging.await.unwrap();
    assert!(expired.unwrap_err().is::<DeadlineExceeded>());
    // 3. The outage: three attempts fail, the fourth failure opens the
    // circuit and stops the retries; the next call is refused at once.
    let _ = stack.clone().oneshot(Request::new(String::new())).await;
    assert_eq!(breaker.snapshot().state, State::Open);
    let refused = stack.oneshot(Request::new(String::new())).await;
    assert!(refused.unwrap_err().is::<CircuitOpen>());

    let page = exporter.render();
    let b = [("breaker", NAME)];
    let get = |name: &str, labels: &[(&str, &str)]| {
        sample(&page, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{page}"))
    };
    // The breaker: 1 expired attempt + 3 refused with 503 = 4 failures; the
    // bulkhead's rejection ignored; open, after one transition; the last
    // call (and the retry refused before its backoff) rejected.
    assert_eq!(
        get(metrics::CALLS, &[("breaker", NAME), ("outcome", "failure")]),
        4.0
    );
    assert_eq!(
        get(metrics::CALLS, &[("breaker", NAME), ("outcome", "ignored")]),
        1.0
    );
    assert_eq!(
        get(metrics::CALLS, &[("breaker", NAME), ("outcome", "success")]),
        0.0
    );
    assert_eq!(get(metrics::STATE, &b), 1.0);
    assert_eq!(
        get(
            metrics::TRANSITIONS,
            &[("breaker", NAME), ("from", "closed"), ("to", "open")]
        ),
        1.0
    );
    assert!(get(metrics::REJECTIONS, &b) >= 1.0);
    assert_eq!(
        get(metrics::PROBES, &[("breaker", NAME), ("result", "success")]),
        0.0
    );
    // The retry layer: the outage call's two retries were sent.
    let d = [("dependency", NAME)];
    assert_eq!(get(tower_retry_budget::metrics::RETRIES, &d), 2.0);
    // The bulkhead: one rejection, nothing in flight any more.
    let c = [("compartment", NAME)];
    assert_eq!(get(tower_bulkhead::metrics::REJECTIONS, &c), 1.0);
    assert_eq!(get(tower_bulkhead::metrics::IN_FLIGHT, &c), 0.0);
    // The deadline: the hanging call expired in both deadline layers (the
    // per-attempt one reports it to the retry layer and the breaker).
    assert!(get(tower_deadline::metrics::CLIENT_EXPIRED, &d) >= 1.0);
}
