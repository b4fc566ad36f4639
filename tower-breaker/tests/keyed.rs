//! One breaker per key, in a bounded registry.

mod support;

use support::*;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_breaker::{BreakerRegistry, KeyedBreakerLayer, Mode, State};

fn by_host(req: &http::Request<String>) -> String {
    req.uri().host().unwrap_or("none").to_owned()
}

async fn get<S>(svc: &S, host: &str) -> Result<http::Response<String>, BoxError>
where
    S: Service<http::Request<String>, Response = http::Response<String>, Error = BoxError> + Clone,
{
    let req = http::Request::get(format!("http://{host}/"))
        .body(String::new())
        .unwrap();
    svc.clone().oneshot(req).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_key_has_its_own_circuit() {
    let registry = BreakerRegistry::new("hosts", config().count_window(2).minimum_calls(2));
    let calls = CallCounter::default();
    let svc = KeyedBreakerLayer::new(registry.clone(), by_host).layer(answering(&calls, 503));
    get(&svc, "down.example").await.unwrap();
    get(&svc, "down.example").await.unwrap();
    assert!(
        get(&svc, "down.example").await.is_err(),
        "open for this host"
    );
    assert_eq!(
        get(&svc, "up.example").await.unwrap().status(),
        503,
        "other hosts pass"
    );
    let down = registry.find(&"down.example".to_owned()).unwrap();
    assert_eq!(down.snapshot().state, State::Open);
    assert_eq!(down.name(), "hosts:down.example");
    assert_eq!(
        registry
            .find(&"up.example".to_owned())
            .unwrap()
            .snapshot()
            .state,
        State::Closed
    );
    assert_eq!(calls.calls(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_registry_is_bounded_and_evicts_idle_closed_breakers() {
    let registry = BreakerRegistry::new("hosts", config())
        .max_keys(3)
        .idle_eviction(secs(60));
    for i in 0..3 {
        registry.get(&format!("h{i}"));
    }
    registry.get(&"h0".to_owned()).set_mode(Mode::ForcedOpen);
    // Full, nothing idle yet: the overflow breaker.
    assert_eq!(registry.get(&"h3".to_owned()).name(), "hosts:overflow");
    assert_eq!(registry.len(), 3);
    advance(secs(60)).await;
    // h1 and h2 are idle and closed: evicted; h0 is not closed: kept.
    let h3 = registry.get(&"h3".to_owned());
    assert_eq!(h3.name(), "hosts:h3");
    assert_eq!(registry.len(), 2);
    assert!(registry.find(&"h0".to_owned()).is_some());
    assert!(registry.find(&"h1".to_owned()).is_none());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hostile_keys_cannot_grow_memory() {
    let registry = BreakerRegistry::new("paths", config()).max_keys(100);
    for i in 0..10_000 {
        registry.get(&format!("/random/{i}"));
    }
    assert_eq!(registry.len(), 100);
}
