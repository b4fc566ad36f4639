//! One breaker per key, in a bounded registry: each key's circuit, the
//! three flavours of the keyed layer, its classifier and its per-key
//! attempt hooks.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use support::*;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_breaker::error::CircuitOpen;
use tower_breaker::keyed::{KeyedHttpBreakerLayer, KeyedPlainBreakerLayer};
use tower_breaker::{BreakerRegistry, KeyedBreakerLayer, Mode, State};
use tower_resilience_base::error::LocalRejection;

fn by_host(req: &Request<String>) -> String {
    req.uri().host().unwrap_or("none").to_owned()
}

fn to(host: &str) -> Request<String> {
    Request::get(format!("http://{host}/"))
        .body(String::new())
        .unwrap()
}

async fn get<S, B>(svc: &S, host: &str) -> Result<Response<B>, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
{
    svc.clone().oneshot(to(host)).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_key_has_its_own_circuit() {
    let registry = BreakerRegistry::new("hosts", config().count_window(2).minimum_calls(2));
    let calls = CallCounter::default();
    let svc = KeyedBreakerLayer::new(registry.clone(), by_host).layer(answering(&calls, 503));
    get(&svc, "down.example").await.unwrap();
    get(&svc, "down.example").await.unwrap();
    let err = get(&svc, "down.example").await.unwrap_err();
    let open = err
        .downcast_ref::<CircuitOpen>()
        .expect("open for this host");
    assert_eq!(open.breaker(), "hosts:down.example");
    assert_eq!(
        get(&svc, "up.example").await.unwrap().status(),
        503,
        "other hosts pass"
    );
    let down = registry.find(&"down.example".to_owned()).unwrap();
    assert_eq!(down.snapshot().state, State::Open);
    assert_eq!(down.name(), "hosts:down.example");
    let up = registry.find(&"up.example".to_owned()).unwrap();
    assert_eq!(up.snapshot().state, State::Closed);
    assert_eq!(calls.calls(), 3);
}

/// A key that counts its live copies and the bytes they hold, so a test
/// sees what the registry keeps, not only how many entries it reports.
#[derive(Debug)]
struct TrackedKey {
    name: String,
    live: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

impl TrackedKey {
    fn new(name: String, live: &Arc<AtomicUsize>, bytes: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, SeqCst);
        bytes.fetch_add(name.capacity(), SeqCst);
        Self {
            name,
            live: live.clone(),
            bytes: bytes.clone(),
        }
    }
}

impl Clone for TrackedKey {
    fn clone(&self) -> Self {
        Self::new(self.name.clone(), &self.live, &self.bytes)
    }
}

impl Drop for TrackedKey {
    fn drop(&mut self) {
        self.live.fetch_sub(1, SeqCst);
        self.bytes.fetch_sub(self.name.capacity(), SeqCst);
    }
}

impl PartialEq for TrackedKey {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for TrackedKey {}

impl std::hash::Hash for TrackedKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl std::fmt::Display for TrackedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hostile_keys_cannot_grow_memory() {
    // 10 000 distinct 1 KiB keys against a registry of 100: the entries,
    // and the key copies (and their bytes) the registry holds on to, stay
    // at 100 keys' worth; every other copy has been dropped.
    const KEY_BYTES: usize = 1024;
    let live = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicUsize::new(0));
    let registry = BreakerRegistry::new("paths", config()).max_keys(100);
    for i in 0..10_000 {
        let mut name = format!("/random/{i}/");
        name.extend(std::iter::repeat_n('x', KEY_BYTES - name.len()));
        let key = TrackedKey::new(name, &live, &bytes);
        drop(registry.get(&key));
    }
    assert_eq!(registry.len(), 100);
    assert_eq!(registry.breakers().len(), 100);
    let kept = live.load(SeqCst);
    assert!(kept <= 100, "{kept} key copies kept for 100 entries");
    assert!(bytes.load(SeqCst) <= 100 * KEY_BYTES);
    // Every breaker name is bounded the same way (prefix, colon, key).
    let names: usize = registry
        .breakers()
        .iter()
        .map(|(_, b)| b.name().len())
        .sum();
    assert!(names <= 100 * ("paths:".len() + KEY_BYTES));
    // The registry itself owns the copies: dropping it frees them all.
    drop(registry);
    assert_eq!((live.load(SeqCst), bytes.load(SeqCst)), (0, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_layers_classifier_judges_each_keys_calls() {
    let registry = BreakerRegistry::new("hosts", config().count_window(2).minimum_calls(2));
    let calls = CallCounter::default();
    let svc = KeyedBreakerLayer::new(registry.clone(), by_host)
        .classifier(Lenient503)
        .layer(answering(&calls, 503));
    for _ in 0..5 {
        assert_eq!(get(&svc, "shedding.example").await.unwrap().status(), 503);
    }
    let s = registry
        .find(&"shedding.example".to_owned())
        .unwrap()
        .snapshot();
    assert_eq!(s.state, State::Closed, "503 is a success here");
    assert_eq!(s.totals.successful, 5);
    assert_eq!(calls.calls(), 5);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_server_flavour_answers_503_for_an_open_key_and_keeps_the_inner_error_type() {
    let registry = BreakerRegistry::new("routes", config());
    let handled = CallCounter::default();
    let counter = handled.clone();
    let handler = service_fn(move |_req: Request<String>| {
        counter.hit();
        async { Ok::<_, Infallible>(Response::new(String::from("ok"))) }
    });
    let server = KeyedHttpBreakerLayer::new(registry.clone(), by_host).layer(handler);
    registry
        .get(&"closed.example".to_owned())
        .set_mode(Mode::ForcedOpen);

    let response = server.clone().oneshot(to("closed.example")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["x-tower-no-retry"], "1");
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(handled.calls(), 0, "the handler was not called");

    let grpc = Request::post("http://closed.example/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    let response = server.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "14");

    let response = server.oneshot(to("open.example")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(handled.calls(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_server_flavour_asks_the_classifier_about_inner_errors() {
    let registry = BreakerRegistry::new("routes", config());
    let shed = service_fn(|_req: Request<String>| async {
        Err::<Response<String>, _>(LocalRejection::new("shed"))
    });
    let broken = service_fn(|_req: Request<String>| async {
        Err::<Response<String>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    });
    let shed = KeyedHttpBreakerLayer::new(registry.clone(), by_host).layer(shed);
    let broken = KeyedHttpBreakerLayer::new(registry.clone(), by_host).layer(broken);

    let err: LocalRejection = shed.oneshot(to("shed.example")).await.unwrap_err();
    let _ = err;
    let err: std::io::Error = broken.oneshot(to("broken.example")).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);

    let shed = registry
        .find(&"shed.example".to_owned())
        .unwrap()
        .snapshot();
    assert_eq!(
        (shed.totals.ignored, shed.totals.failed),
        (1, 0),
        "a local rejection says nothing about the key"
    );
    let broken = registry
        .find(&"broken.example".to_owned())
        .unwrap()
        .snapshot();
    assert_eq!((broken.totals.ignored, broken.totals.failed), (0, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn http_answers_keeps_the_registry_the_key_function_and_the_classifier() {
    let registry = BreakerRegistry::new("hosts", config().count_window(2).minimum_calls(2));
    let calls = CallCounter::default();
    let counter = calls.clone();
    let handler = service_fn(move |_req: Request<String>| {
        counter.hit();
        async {
            let mut r = Response::new(String::new());
            *r.status_mut() = StatusCode::IM_A_TEAPOT;
            Ok::<_, Infallible>(r)
        }
    });
    let layer = KeyedBreakerLayer::new(registry.clone(), by_host)
        .classifier(FailsOn(418))
        .http_answers();
    let server = layer.layer(handler);
    for _ in 0..2 {
        let r = server.clone().oneshot(to("teapot.example")).await.unwrap();
        assert_eq!(r.status(), 418);
    }
    let r = server.oneshot(to("teapot.example")).await.unwrap();
    assert_eq!(r.status(), 503, "418 failed, by the classifier kept");
    assert_eq!(calls.calls(), 2);
    assert_eq!(
        layer
            .registry()
            .find(&"teapot.example".to_owned())
            .unwrap()
            .snapshot()
            .state,
        State::Open
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_plain_flavour_keys_any_request_type() {
    let registry = BreakerRegistry::new("tenant", config().count_window(2).minimum_calls(2));
    let calls = CallCounter::default();
    let counter = calls.clone();
    let query = service_fn(move |tenant: u32| {
        counter.hit();
        async move {
            if tenant == 13 {
                Err::<u32, BoxError>("unlucky".into())
            } else {
                Ok(tenant)
            }
        }
    });
    let svc = KeyedPlainBreakerLayer::new(registry.clone(), |tenant: &u32| *tenant).layer(query);
    assert!(svc.clone().oneshot(13).await.is_err());
    assert!(svc.clone().oneshot(13).await.is_err());
    let err = svc.clone().oneshot(13).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<CircuitOpen>().unwrap().breaker(),
        "tenant:13"
    );
    assert_eq!(svc.clone().oneshot(7).await.unwrap(), 7);
    assert_eq!(calls.calls(), 3);

    // `plain()` from the client layer: the same registry, ErrorsOnly.
    let plain = KeyedBreakerLayer::new(registry.clone(), |tenant: &u32| *tenant).plain();
    let svc = plain.layer(service_fn(|t: u32| async move { Ok::<_, BoxError>(t) }));
    assert!(svc.oneshot(13).await.unwrap_err().is::<CircuitOpen>());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_key_function_generic_over_the_body_is_inferred_from_the_service() {
    fn by_authority<B>(req: &Request<B>) -> String {
        req.uri().authority().map_or("", |a| a.as_str()).to_owned()
    }
    let registry = BreakerRegistry::new("hosts", config());
    let calls = CallCounter::default();
    let svc = KeyedBreakerLayer::new(registry.clone(), by_authority).layer(answering(&calls, 200));
    get(&svc, "a.example").await.unwrap();
    assert!(registry.find(&"a.example".to_owned()).is_some());
}

/// An inner service of one slot (tower's `ConcurrencyLimit`): not ready
/// while a call holds it.
fn one_slot(
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    tower::limit::ConcurrencyLimit::new(ok_infallible(), 1)
}

/// Every keyed flavour is ready when, and only when, its inner service is
/// (and is woken when it becomes ready): it forwards the readiness and
/// adds none of its own.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_keyed_flavour_is_ready_only_when_its_inner_service_is() {
    let registry = BreakerRegistry::new("hosts", config());
    macro_rules! check {
        ($flavour:literal, $layer:expr) => {{
            let mut svc = tower_test::mock::Spawn::new($layer.layer(one_slot()));
            tokio_test::assert_ready_ok!(svc.poll_ready(), $flavour);
            let holding = svc.call(to("a"));
            tokio_test::assert_pending!(svc.poll_ready(), "{}: its slot is taken", $flavour);
            drop(holding);
            assert!(svc.is_woken(), "{}", $flavour);
            tokio_test::assert_ready_ok!(svc.poll_ready(), $flavour);
        }};
    }
    check!("client", KeyedBreakerLayer::new(registry.clone(), by_host));
    check!(
        "server",
        KeyedBreakerLayer::new(registry.clone(), by_host).http_answers()
    );
    check!(
        "plain",
        KeyedBreakerLayer::new(registry.clone(), by_host).plain()
    );
}

/// The keyed types name themselves and their parts in `Debug`: the
/// layers, the services with their registry and key function, and the
/// response future with its state.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_keyed_types_say_what_they_are_in_debug() {
    let registry = BreakerRegistry::new("hosts", config());
    let client = KeyedBreakerLayer::new(registry.clone(), by_host);
    let server = client.clone().http_answers();
    let plain = client.clone().plain();
    for (debug, name) in [
        (format!("{client:?}"), "KeyedBreakerLayer"),
        (format!("{server:?}"), "KeyedHttpBreakerLayer"),
        (format!("{plain:?}"), "KeyedPlainBreakerLayer"),
    ] {
        assert!(debug.starts_with(name), "{debug}");
        assert!(debug.contains("PerKey"), "{debug}");
        assert!(debug.contains("by_host"), "the key function: {debug}");
    }
    let mut svc = client.layer(ok_infallible());
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let future = svc.call(to("a"));
    assert_eq!(
        format!("{future:?}"),
        "KeyedFuture { state: \"called\", .. }"
    );
}
