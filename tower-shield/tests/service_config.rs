//! gRPC service configs (gRFC A6): parsing and its refusals, the A6 lookup
//! and backoff bounds, and, through a real gRPC server on 127.0.0.1 and a
//! tonic `Channel` under `client_stack(..).service_config(..).tonic(..)`,
//! what each policy does: listed codes retried and others not, the
//! attempts bounded, per-method policies, hedges after their delay, the
//! server's pushback, and the retry throttle.
//!
//! The server is written by hand with `tonic::server::Grpc` and prost
//! messages, as in `tests/tonic.rs`. Tests over real sockets assert counts
//! and the order of events, and lower bounds only where a timer sets them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::time::Instant;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::BreakerConfig;
use tower_service::Service;
use tower_shield::retry::StopReason;
use tower_shield::service_config::{ServiceConfig, ServiceConfigTonic};
use tower_shield::stack::{client_stack, ClientStack};

// ------------------------------------------------------------------ messages

#[derive(Clone, PartialEq, prost::Message)]
struct Query {
    #[prost(string, tag = "1")]
    sku: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Receipt {
    /// The attempt that answered: 1 + its `grpc-previous-rpc-attempts`.
    #[prost(uint32, tag = "1")]
    attempt: u32,
}

// ------------------------------------------------------------------ server

/// What the server does with the next calls.
#[derive(Debug, Clone)]
struct Script {
    /// Calls left to fail (`u32::MAX`: every call).
    failures: u32,
    /// The code they fail with.
    code: Code,
    /// A `grpc-retry-pushback-ms` to send with the failures.
    pushback: Option<&'static str>,
    /// First attempts (no `grpc-previous-rpc-attempts`) wait this long.
    slow_first: Option<Duration>,
}

/// An attempt the server received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    previous: Option<u32>,
    at: Instant,
}

struct Backend {
    script: Mutex<Script>,
    seen: Mutex<Vec<Seen>>,
}

impl Backend {
    fn script(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.script.lock().unwrap());
    }

    /// Fail the next `n` calls with `code` (`u32::MAX`: all of them).
    fn fail(&self, n: u32, code: Code) {
        self.script(|s| {
            s.failures = n;
            s.code = code;
        });
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn attempts(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    async fn answer(
        &self,
        path: String,
        request: tonic::Request<Query>,
    ) -> Result<Receipt, Status> {
        let previous = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().parse::<u32>().unwrap());
        self.seen.lock().unwrap().push(Seen {
            path,
            previous,
            at: Instant::now(),
        });
        let slow = self.script.lock().unwrap().slow_first;
        if let Some(wait) = slow.filter(|_| previous.is_none()) {
            tokio::time::sleep(wait).await;
        }
        // After the wait: a failure is taken by whichever attempt comes
        // first, checked and counted under one lock.
        let failure = {
            let mut script = self.script.lock().unwrap();
            let failure = (script.failures > 0).then(|| (script.code, script.pushback));
            if script.failures > 0 && script.failures != u32::MAX {
                script.failures -= 1;
            }
            failure
        };
        if let Some((code, pushback)) = failure {
            let mut status = Status::new(code, "scripted failure");
            if let Some(ms) = pushback {
                status
                    .metadata_mut()
                    .insert("grpc-retry-pushback-ms", ms.parse().unwrap());
            }
            return Err(status);
        }
        Ok(Receipt {
            attempt: previous.unwrap_or(0) + 1,
        })
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Any unary method of the service, answered by the backend.
fn serve(
    backend: Arc<Backend>,
    request: http::Request<tonic::body::Body>,
) -> BoxFuture<Result<http::Response<tonic::body::Body>, Infallible>> {
    Box::pin(async move {
        let path = request.uri().path().to_owned();
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<Receipt, Query>::default());
        Ok(grpc.unary(Handler(backend, path), request).await)
    })
}

struct Handler(Arc<Backend>, String);

impl UnaryService<Query> for Handler {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, Status>>;

    fn call(&mut self, request: tonic::Request<Query>) -> Self::Future {
        let (backend, path) = (self.0.clone(), self.1.clone());
        Box::pin(async move {
            backend
                .answer(path, request)
                .await
                .map(tonic::Response::new)
        })
    }
}

/// A server for the gRPC service `$name`: every method is answered by
/// `serve` on the shared backend.
macro_rules! grpc_server {
    ($(#[$doc:meta])* $server:ident, $name:literal) => {
        $(#[$doc])*
        #[derive(Clone)]
        struct $server(Arc<Backend>);

        impl NamedService for $server {
            const NAME: &'static str = $name;
        }

        impl Service<http::Request<tonic::body::Body>> for $server {
            type Response = http::Response<tonic::body::Body>;
            type Error = Infallible;
            type Future = BoxFuture<Result<Self::Response, Infallible>>;

            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
                serve(self.0.clone(), request)
            }
        }
    };
}

grpc_server!(
    /// The server side of `test.Shop/*`.
    ShopServer,
    "test.Shop"
);
grpc_server!(
    /// The server side of `test.Search/*`.
    SearchServer,
    "test.Search"
);

/// A healthy server on a free port of 127.0.0.1.
async fn start() -> (SocketAddr, Arc<Backend>) {
    let backend = Arc::new(Backend {
        script: Mutex::new(Script {
            failures: 0,
            code: Code::Unavailable,
            pushback: None,
            slow_first: None,
        }),
        seen: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let (shop, search) = (ShopServer(backend.clone()), SearchServer(backend.clone()));
    tokio::spawn(async move {
        Server::builder()
            .add_service(shop)
            .add_service(search)
            .serve_with_incoming(incoming)
            .await
    });
    (addr, backend)
}

// ------------------------------------------------------------------ client

/// The channel, recording when each attempt is handed to it.
#[derive(Clone)]
struct Recorder {
    channel: Channel,
    sent: Arc<Mutex<Vec<Instant>>>,
}

impl Service<http::Request<tonic::body::Body>> for Recorder {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = <Channel as Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        self.sent.lock().unwrap().push(Instant::now());
        self.channel.call(request)
    }
}

type Client = tonic::client::Grpc<ServiceConfigTonic<Recorder>>;

/// A client stack whose breaker never opens in these tests, so that what
/// they see is the service config's doing.
fn stack(name: &'static str) -> ClientStack {
    client_stack(name).breaker_config(BreakerConfig::new().count_window(1000).minimum_calls(1000))
}

/// A client of `stack` with `config` applied, over a channel to `addr`;
/// and the instants the attempts were sent.
async fn connect(
    addr: SocketAddr,
    config: &ServiceConfig,
) -> (
    Client,
    tower_shield::service_config::ServiceConfigStack,
    Arc<Mutex<Vec<Instant>>>,
) {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let recorder = Recorder {
        channel,
        sent: sent.clone(),
    };
    let stack = stack("shop").service_config(config);
    (tonic::client::Grpc::new(stack.tonic(recorder)), stack, sent)
}

/// Calls the unary method at `path` as a generated client would.
async fn call(client: &mut Client, path: &'static str) -> Result<Receipt, Status> {
    client.ready().await?;
    let request = tonic::Request::new(Query {
        sku: "apple".into(),
    });
    let codec = ProstCodec::<Query, Receipt>::default();
    client
        .unary(request, PathAndQuery::from_static(path), codec)
        .await
        .map(tonic::Response::into_inner)
}

/// A config with one retry policy for `name` (JSON), tiny backoffs.
fn retrying(name: &str, max_attempts: u32, codes: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{
          "methodConfig": [{{
            "name": [{name}],
            "retryPolicy": {{
              "maxAttempts": {max_attempts},
              "initialBackoff": "0.001s",
              "maxBackoff": "0.005s",
              "backoffMultiplier": 2,
              "retryableStatusCodes": [{codes}]
            }}
          }}]
        }}"#
    ))
    .unwrap()
}

const ORDER: &str = "/test.Shop/Order";
const PAY: &str = "/test.Shop/Pay";
const FIND: &str = "/test.Search/Find";

// ------------------------------------------------------------------ types

/// A generated client is cloned into tasks: the service, its clones and
/// its futures must be `Send` (and the service `Sync`, as a channel is).
#[test]
fn the_service_and_its_future_are_send() {
    fn service<T: Clone + Send + Sync + 'static>() {}
    fn future<T: Send + 'static>() {}
    service::<ServiceConfigTonic<Channel>>();
    future::<<ServiceConfigTonic<Channel> as Service<http::Request<tonic::body::Body>>>::Future>();
    service::<ServiceConfig>();
    service::<tower_shield::service_config::ServiceConfigStack>();
}

// ------------------------------------------------------------------ parsing

/// A config in the style of gRPC's documentation: a retried service, a
/// method of it without a policy, a hedged method, throttling, and fields
/// this module ignores.
const EXAMPLE: &str = r#"{
  "loadBalancingConfig": [{ "round_robin": {} }],
  "methodConfig": [
    {
      "name": [
        { "service": "warehouse.Inventory" },
        { "service": "warehouse.Pricing", "method": "Quote" }
      ],
      "waitForReady": true,
      "timeout": "2.5s",
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.25s",
        "maxBackoff": "3s",
        "backoffMultiplier": 1.6,
        "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED", 10],
        "perAttemptRecvTimeout": "1s"
      }
    },
    {
      "name": [{ "service": "warehouse.Inventory", "method": "Adjust" }],
      "timeout": "1s"
    },
    {
      "name": [{ "service": "warehouse.Search", "method": "Lookup" }],
      "hedgingPolicy": {
        "maxAttempts": 3,
        "hedgingDelay": "0.040s",
        "nonFatalStatusCodes": ["UNAVAILABLE", "INTERNAL"]
      }
    },
    {
      "name": [{}],
      "retryPolicy": {
        "maxAttempts": "2",
        "initialBackoff": "1s",
        "maxBackoff": "1s",
        "backoffMultiplier": "1",
        "retryableStatusCodes": [14]
      }
    }
  ],
  "retryThrottling": { "maxTokens": 25, "tokenRatio": 0.35 }
}"#;

#[test]
fn a_config_in_the_style_of_grpcs_examples_parses() {
    let config = ServiceConfig::from_json(EXAMPLE).unwrap();
    assert!(config.adjustments().is_empty());
    assert_eq!(config.method_configs().len(), 4);

    let inventory = config.lookup("warehouse.Inventory", "Count").unwrap();
    let retry = inventory.retry_policy().unwrap();
    assert_eq!(retry.max_attempts(), 4);
    assert_eq!(retry.initial_backoff(), Duration::from_millis(250));
    assert_eq!(retry.max_backoff(), Duration::from_secs(3));
    assert_eq!(retry.backoff_multiplier(), 1.6);
    let codes = retry.retryable_status_codes();
    assert_eq!(
        codes.iter().collect::<Vec<_>>(),
        [Code::ResourceExhausted, Code::Aborted, Code::Unavailable]
    );
    assert_eq!(inventory.names()[0].service(), Some("warehouse.Inventory"));
    assert_eq!(inventory.names()[0].method(), None);

    let hedge = config
        .lookup("warehouse.Search", "Lookup")
        .unwrap()
        .hedging_policy()
        .unwrap();
    assert_eq!(hedge.max_attempts(), 3);
    assert_eq!(hedge.hedging_delay(), Duration::from_millis(40));
    assert!(hedge.non_fatal_status_codes().contains(Code::Internal));

    // Integers and numbers as strings, as protobuf's JSON form allows.
    let default = config.lookup("other.Service", "Any").unwrap();
    assert_eq!(default.retry_policy().unwrap().max_attempts(), 2);
    assert_eq!(default.retry_policy().unwrap().backoff_multiplier(), 1.0);

    let throttling = config.retry_throttling().unwrap();
    assert_eq!(throttling.max_tokens(), 25);
    assert_eq!(throttling.token_ratio(), 0.35);

    // The same through serde and `str::parse`.
    let via_serde: ServiceConfig = serde_json::from_str(EXAMPLE).unwrap();
    assert_eq!(via_serde.method_configs(), config.method_configs());
    let parsed: ServiceConfig = EXAMPLE.parse().unwrap();
    assert_eq!(parsed.retry_throttling(), config.retry_throttling());
}

/// A6's lookup: the config naming service and method, then the service
/// alone, then `{}`; a method config without a policy still shadows the
/// ones below it.
#[test]
fn a_methods_config_is_found_by_method_then_service_then_default() {
    let config = ServiceConfig::from_json(EXAMPLE).unwrap();
    let index = |service, method| {
        let found = config.lookup(service, method).unwrap();
        config
            .method_configs()
            .iter()
            .position(|m| std::ptr::eq(m, found))
            .unwrap()
    };
    assert_eq!(index("warehouse.Pricing", "Quote"), 0, "exact");
    assert_eq!(index("warehouse.Inventory", "Count"), 0, "service");
    assert_eq!(
        index("warehouse.Inventory", "Adjust"),
        1,
        "exact over service"
    );
    assert!(config
        .lookup("warehouse.Inventory", "Adjust")
        .unwrap()
        .retry_policy()
        .is_none());
    assert_eq!(index("warehouse.Pricing", "List"), 3, "the default");
    assert_eq!(index("warehouse.Search", "Lookup"), 2);

    let no_default = ServiceConfig::from_json(
        r#"{ "methodConfig": [{ "name": [{ "service": "a.B", "method": "C" }] }] }"#,
    )
    .unwrap();
    assert!(no_default.lookup("a.B", "D").is_none());
    assert!(no_default.lookup("a.X", "C").is_none());
}

/// A retry policy with one field replaced (`null` removes it).
fn with_retry(key: &str, value: &str) -> String {
    let mut policy = serde_json::json!({
        "maxAttempts": 3,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]
    });
    let value: serde_json::Value = serde_json::from_str(value).unwrap();
    if value.is_null() {
        policy.as_object_mut().unwrap().remove(key);
    } else {
        policy[key] = value;
    }
    serde_json::json!({ "methodConfig": [{ "name": [{ "service": "a.B" }], "retryPolicy": policy }] })
        .to_string()
}

#[test]
fn each_invalid_config_is_refused_with_the_field_named() {
    let retry = |field: &str| format!("methodConfig[0].retryPolicy.{field}");
    let cases: Vec<(String, String, &str)> = vec![
        (
            with_retry("maxAttempts", "1"),
            retry("maxAttempts"),
            "must be greater than 1, got 1",
        ),
        (
            with_retry("initialBackoff", "null"),
            retry("initialBackoff"),
            "missing",
        ),
        (
            with_retry("backoffMultiplier", "0"),
            retry("backoffMultiplier"),
            "must be greater than 0, got 0",
        ),
        (
            with_retry("retryableStatusCodes", "[]"),
            retry("retryableStatusCodes"),
            "at least one status code",
        ),
        (
            with_retry("initialBackoff", r#""5""#),
            retry("initialBackoff"),
            r#"invalid duration "5""#,
        ),
        (
            with_retry("maxBackoff", r#""0s""#),
            retry("maxBackoff"),
            "must be greater than 0",
        ),
        (
            with_retry("retryableStatusCodes", r#"["UNAVAILABLE", "UNAVAILBLE"]"#),
            retry("retryableStatusCodes[1]"),
            r#"unknown status code "UNAVAILBLE""#,
        ),
        (
            with_retry("retryableStatusCodes", "[17]"),
            retry("retryableStatusCodes[0]"),
            "unknown status code 17",
        ),
        (
            with_retry("retryableStatusCodes", r#"["OK"]"#),
            retry("retryableStatusCodes[0]"),
            "OK is not a failure",
        ),
        (
            with_retry("maxAttempts", r#""three""#),
            retry("maxAttempts"),
            "expected a whole number",
        ),
        (
            r#"{ "methodConfig": [{ "name": [{}],
                 "retryPolicy": { "maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s",
                                  "backoffMultiplier": 2, "retryableStatusCodes": [14] },
                 "hedgingPolicy": { "maxAttempts": 2 } }] }"#
                .into(),
            "methodConfig[0]".into(),
            "both `retryPolicy` and `hedgingPolicy`",
        ),
        (
            r#"{ "methodConfig": [{ "name": [{}], "hedgingPolicy": { "hedgingDelay": "1s" } }] }"#
                .into(),
            "methodConfig[0].hedgingPolicy.maxAttempts".into(),
            "missing",
        ),
        (
            r#"{ "methodConfig": [{ "name": [{}], "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "-1s" } }] }"#
                .into(),
            "methodConfig[0].hedgingPolicy.hedgingDelay".into(),
            "must be at least 0",
        ),
        (
            r#"{ "retryThrottling": { "maxTokens": 0, "tokenRatio": 0.1 } }"#.into(),
            "retryThrottling.maxTokens".into(),
            "must be greater than 0 and at most 1000, got 0",
        ),
        (
            r#"{ "retryThrottling": { "maxTokens": 1001, "tokenRatio": 0.1 } }"#.into(),
            "retryThrottling.maxTokens".into(),
            "must be greater than 0 and at most 1000, got 1001",
        ),
        (
            r#"{ "retryThrottling": { "maxTokens": 10, "tokenRatio": 0 } }"#.into(),
            "retryThrottling.tokenRatio".into(),
            "must be greater than 0",
        ),
        (
            r#"{ "retryThrottling": { "maxTokens": 10 } }"#.into(),
            "retryThrottling.tokenRatio".into(),
            "missing",
        ),
        (
            r#"{ "methodConfig": [
                 { "name": [{ "service": "a.B", "method": "C" }] },
                 { "name": [{ "service": "a.D" }, { "service": "a.B", "method": "C" }] }
               ] }"#
                .into(),
            "methodConfig[1].name[1]".into(),
            r#"duplicate name {service: "a.B", method: "C"}, already at methodConfig[0].name[0]"#,
        ),
        (
            r#"{ "methodConfig": [{ "name": [{}] }, { "name": [{ "service": "" }] }] }"#.into(),
            "methodConfig[1].name[0]".into(),
            "duplicate name {}",
        ),
        (
            r#"{ "methodConfig": [{ "name": [{ "method": "C" }] }] }"#.into(),
            "methodConfig[0].name[0].method".into(),
            "has no `service`",
        ),
        (
            r#"{ "methodConfig": { "name": [] } }"#.into(),
            "methodConfig".into(),
            "expected a list, got an object",
        ),
        (
            r#"{ "methodConfig": [ "#.into(),
            "".into(),
            "not JSON",
        ),
    ];
    for (json, path, message) in cases {
        let error = ServiceConfig::from_json(&json).unwrap_err();
        assert_eq!(error.path(), path, "{json}");
        assert!(
            error.message().contains(message),
            "{json}: {:?} does not say {message:?}",
            error.message()
        );
        let text = error.to_string();
        assert!(text.starts_with("invalid service config"), "{text}");
        if !path.is_empty() {
            assert!(text.contains(&path), "{text} names {path}");
        }
        // Through serde, the message (and its path) is the error's.
        let via_serde = serde_json::from_str::<ServiceConfig>(&json);
        if !path.is_empty() {
            assert!(via_serde.unwrap_err().to_string().contains(&path));
        }
    }
    let not_json = ServiceConfig::from_json("{").unwrap_err();
    assert!(std::error::Error::source(&not_json).is_some());
}

#[test]
fn max_attempts_above_five_is_capped_to_five_and_reported() {
    let config = ServiceConfig::from_json(&with_retry("maxAttempts", "7")).unwrap();
    let policy = config.lookup("a.B", "C").unwrap().retry_policy().unwrap();
    assert_eq!(policy.max_attempts(), 5);
    let [capped] = config.adjustments() else {
        panic!("one adjustment: {:?}", config.adjustments());
    };
    assert_eq!(capped.path(), "methodConfig[0].retryPolicy.maxAttempts");
    assert_eq!((capped.requested(), capped.applied()), (7, 5));
    assert!(capped.to_string().contains("7 capped to 5"), "{capped}");
    // Exactly 5 is no adjustment.
    let five = ServiceConfig::from_json(&with_retry("maxAttempts", "5")).unwrap();
    assert!(five.adjustments().is_empty());
}

// ------------------------------------------------------------------ backoff

/// A6's n-th retry (from 1) waits `random(0, min(initialBackoff *
/// backoffMultiplier^(n-1), maxBackoff))`: the policy's backoff has
/// exactly those bounds, for a multiplier of 2 and one that is not.
#[test]
fn the_backoff_bounds_are_a6s() {
    for (multiplier, initial, max) in [(2.0, 0.1, 1.0), (1.5, 0.1, 0.3), (1.3, 0.2, 5.0)] {
        let config = ServiceConfig::from_json(&format!(
            r#"{{ "methodConfig": [{{ "name": [{{}}], "retryPolicy": {{
                "maxAttempts": 5, "initialBackoff": "{initial}s", "maxBackoff": "{max}s",
                "backoffMultiplier": {multiplier}, "retryableStatusCodes": ["UNAVAILABLE"] }} }}] }}"#
        ))
        .unwrap();
        let backoff = config.method_configs()[0].retry_policy().unwrap().backoff();
        for n in 1..=4u32 {
            let a6 = f64::min(initial * f64::powi(multiplier, n as i32 - 1), max);
            let ours = backoff.bound(n - 1).as_secs_f64();
            assert!(
                (ours - a6).abs() < 1e-9,
                "retry {n} with {multiplier}: {ours} s, A6 {a6} s"
            );
        }
    }
}

/// Through the whole stack with tokio's time paused (and a transport that
/// is a function, not a socket): every retry waits at most A6's bound for
/// its number (plus the timer's millisecond), and, over many calls, close
/// to it, so the bound is neither exceeded nor smaller than A6's. With
/// `backoffMultiplier` 1.5 the bounds are 100, 150, 225 and 300 ms (the
/// cap), where a doubling would give 100, 200, 300, 300 ms.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retries_wait_within_a6s_bounds() {
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [{ "name": [{ "service": "test.Shop" }], "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.3s",
            "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"] } }] }"#,
    )
    .unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let transport = service_fn({
        let sent = sent.clone();
        move |req: http::Request<_>| {
            sent.lock().unwrap().push(Instant::now());
            let _body: tower_shield::retry::body::ReplayBody<_> = req.into_body();
            async {
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "14")
                    .body(String::new())?;
                Ok::<_, BoxError>(response)
            }
        }
    });
    let stack = stack("shop").service_config(&config);
    let client = stack.layer(transport);
    let bounds = [100, 150, 225, 300].map(Duration::from_millis);
    let mut longest = [Duration::ZERO; 4];
    for _ in 0..100 {
        sent.lock().unwrap().clear();
        let request = http::Request::post(format!("http://shop{ORDER}"))
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap();
        let response = client.clone().oneshot(request).await.unwrap();
        let gave_up = response
            .extensions()
            .get::<tower_shield::retry::GaveUp>()
            .unwrap();
        assert_eq!(gave_up.reason(), StopReason::Attempts);
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 5);
        for (n, pair) in sent.windows(2).enumerate() {
            let waited = pair[1] - pair[0];
            assert!(
                waited <= bounds[n] + Duration::from_millis(1),
                "retry {}: waited {waited:?}, bound {:?}",
                n + 1,
                bounds[n]
            );
            longest[n] = longest[n].max(waited);
        }
        // Spread the calls out: the budget's floor (5 retries a second)
        // then covers every retry.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (n, (longest, bound)) in longest.iter().zip(bounds).enumerate() {
        assert!(
            *longest >= bound.mul_f64(0.8),
            "retry {}: the longest wait, {longest:?}, is far below the bound {bound:?}",
            n + 1
        );
    }
    assert_eq!(stack.retry_counters().refused_by_budget, 0);
}

/// The waits between the attempts of one call that fails with UNAVAILABLE
/// five times, through `stack` with `config` applied (paused time).
async fn waits_between_attempts(stack: ClientStack, config: &ServiceConfig) -> Vec<Duration> {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let transport = service_fn({
        let sent = sent.clone();
        move |req: http::Request<_>| {
            sent.lock().unwrap().push(Instant::now());
            let _body: tower_shield::retry::body::ReplayBody<_> = req.into_body();
            async {
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "14")
                    .body(String::new())?;
                Ok::<_, BoxError>(response)
            }
        }
    });
    let client = stack.service_config(config).layer(transport);
    let request = http::Request::post(format!("http://shop{ORDER}"))
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    client.oneshot(request).await.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 5, "every attempt made");
    sent.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

/// The stack's `random(..)` reaches the retry layers the config builds: a
/// seed gives the same backoffs every time, and another seed other ones.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_seeded_stack_draws_the_configs_backoffs_from_its_seed() {
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [{ "name": [{ "service": "test.Shop" }], "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.3s",
            "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"] } }] }"#,
    )
    .unwrap();
    let seeded = |seed| stack("shop").random(tower_breaker::SeededRandom::new(seed));
    let first = waits_between_attempts(seeded(5), &config).await;
    assert_eq!(waits_between_attempts(seeded(5), &config).await, first);
    assert_ne!(waits_between_attempts(seeded(6), &config).await, first);
}

// ------------------------------------------------------------------ retries

#[tokio::test]
async fn a_listed_code_is_retried_until_the_server_answers() {
    let (addr, backend) = start().await;
    backend.fail(2, Code::Unavailable);
    let config = retrying(
        r#"{ "service": "test.Shop", "method": "Order" }"#,
        4,
        r#""UNAVAILABLE""#,
    );
    let (mut client, stack, _) = connect(addr, &config).await;

    let receipt = call(&mut client, ORDER).await.unwrap();
    assert_eq!(receipt.attempt, 3);
    let previous: Vec<_> = backend.seen().iter().map(|s| s.previous).collect();
    assert_eq!(
        previous,
        [None, Some(1), Some(2)],
        "grpc-previous-rpc-attempts on every retry"
    );
    assert_eq!(stack.retry_counters().retries, 2);
}

#[tokio::test]
async fn a_code_that_is_not_listed_is_not_retried() {
    let (addr, backend) = start().await;
    let config = retrying(
        r#"{ "service": "test.Shop" }"#,
        4,
        r#""RESOURCE_EXHAUSTED""#,
    );
    let (mut client, _stack, _) = connect(addr, &config).await;

    backend.fail(1, Code::InvalidArgument);
    let status = call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(backend.attempts(), 1);

    // Not even UNAVAILABLE, which the stack retries without a config.
    backend.fail(1, Code::Unavailable);
    let status = call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(backend.attempts(), 2);

    // The listed code, which the stack does not retry without a config.
    backend.fail(1, Code::ResourceExhausted);
    let receipt = call(&mut client, ORDER).await.unwrap();
    assert_eq!(receipt.attempt, 2);
    assert_eq!(backend.attempts(), 4);
}

#[tokio::test]
async fn max_attempts_bounds_the_attempts_and_is_capped_at_five() {
    let (addr, backend) = start().await;
    backend.fail(u32::MAX, Code::Unavailable);

    let config = retrying("{}", 3, r#""UNAVAILABLE""#);
    let (mut client, _stack, _) = connect(addr, &config).await;
    let status = call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(backend.attempts(), 3);
    // The give-up says "do not retry" to the tiers above, in gRPC's words.
    let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
    assert_eq!(pushback, "-1");

    let config = retrying("{}", 7, r#""UNAVAILABLE""#);
    assert_eq!(config.adjustments().len(), 1);
    let (mut client, _stack, _) = connect(addr, &config).await;
    call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(backend.attempts(), 3 + 5, "7 attempts capped to 5");
}

/// `test.Shop` is retried as a service, but its `Pay` has a config of its
/// own without a policy, which A6's lookup prefers.
#[tokio::test]
async fn a_method_without_a_policy_is_not_retried_while_another_is() {
    let (addr, backend) = start().await;
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [
            { "name": [{ "service": "test.Shop" }],
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.002s",
                               "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } },
            { "name": [{ "service": "test.Shop", "method": "Pay" }] }
        ] }"#,
    )
    .unwrap();
    let (mut client, _stack, _) = connect(addr, &config).await;

    backend.fail(1, Code::Unavailable);
    let status = call(&mut client, PAY).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    backend.fail(1, Code::Unavailable);
    let receipt = call(&mut client, ORDER).await.unwrap();
    assert_eq!(receipt.attempt, 2);

    // A service no config names is not retried either.
    backend.fail(1, Code::Unavailable);
    call(&mut client, FIND).await.unwrap_err();

    let paths: Vec<_> = backend.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, [PAY, ORDER, ORDER, FIND]);
}

#[tokio::test]
async fn a_negative_pushback_stops_the_retries_and_a_positive_one_delays_them() {
    let (addr, backend) = start().await;
    let config = retrying("{}", 3, r#""UNAVAILABLE""#);
    let (mut client, _stack, _) = connect(addr, &config).await;

    backend.fail(1, Code::Unavailable);
    backend.script(|s| s.pushback = Some("-1"));
    call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(backend.attempts(), 1, "the server said not to retry");

    // 1 to 5 ms of backoff, but the server asks for 60 ms.
    backend.fail(1, Code::Unavailable);
    backend.script(|s| s.pushback = Some("60"));
    let receipt = call(&mut client, ORDER).await.unwrap();
    assert_eq!(receipt.attempt, 2);
    let seen = backend.seen();
    let waited = seen[2].at - seen[1].at;
    assert!(
        waited >= Duration::from_millis(60),
        "the retry came {waited:?} after the failure"
    );
}

// ------------------------------------------------------------------ hedging

fn hedging(delay: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{ "methodConfig": [{{ "name": [{{ "service": "test.Search", "method": "Find" }}],
            "hedgingPolicy": {{ "maxAttempts": 2, "hedgingDelay": "{delay}",
                                "nonFatalStatusCodes": ["UNAVAILABLE"] }} }}] }}"#
    ))
    .unwrap()
}

#[tokio::test]
async fn a_slow_call_gets_a_hedge_after_the_hedging_delay() {
    let (addr, backend) = start().await;
    backend.script(|s| s.slow_first = Some(Duration::from_secs(30)));
    let (mut client, _stack, sent) = connect(addr, &hedging("0.1s")).await;

    let receipt = call(&mut client, FIND).await.unwrap();
    assert_eq!(receipt.attempt, 2, "the hedge answered");
    let previous: Vec<_> = backend.seen().iter().map(|s| s.previous).collect();
    assert_eq!(previous, [None, Some(1)]);
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    // The hedge's timer starts just before the first attempt is sent: a
    // generous margin for the time between the two.
    let gap = sent[1] - sent[0];
    assert!(
        gap >= Duration::from_millis(50),
        "the hedge went out {gap:?} after the first attempt"
    );
}

#[tokio::test]
async fn a_fast_call_gets_no_hedge() {
    let (addr, backend) = start().await;
    let (mut client, _stack, _) = connect(addr, &hedging("5s")).await;

    assert_eq!(call(&mut client, FIND).await.unwrap().attempt, 1);
    assert_eq!(backend.attempts(), 1);
}

/// The first attempt is slow (it answers OK after 300 ms); the hedge,
/// sent after 20 ms, fails at once. With a non-fatal code the call waits
/// for the first attempt; with any other code the hedge's answer ends it.
#[tokio::test]
async fn a_non_fatal_answer_waits_for_the_other_attempt_and_a_fatal_one_ends_the_call() {
    let (addr, backend) = start().await;
    let (mut client, _stack, _) = connect(addr, &hedging("0.02s")).await;
    backend.script(|s| s.slow_first = Some(Duration::from_millis(300)));

    backend.fail(1, Code::Unavailable); // taken by the hedge
    let receipt = call(&mut client, FIND).await.unwrap();
    assert_eq!(
        receipt.attempt, 1,
        "UNAVAILABLE is non-fatal: the first attempt answered"
    );

    backend.fail(1, Code::InvalidArgument);
    let status = call(&mut client, FIND).await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "the hedge's fatal answer"
    );
    let previous: Vec<_> = backend.seen().iter().map(|s| s.previous).collect();
    assert_eq!(previous, [None, Some(1), None, Some(1)]);
}

// ------------------------------------------------------------------ throttling

/// `maxTokens` 10, `tokenRatio` 1: retries are allowed while more than 5
/// tokens are left. Every failed attempt takes one, every success gives
/// one back.
#[tokio::test]
async fn the_throttle_stops_retries_when_tokens_run_low_and_successes_restore_them() {
    let (addr, backend) = start().await;
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [{ "name": [{ "service": "test.Shop" }],
              "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.002s",
                               "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } }],
             "retryThrottling": { "maxTokens": 10, "tokenRatio": 1 } }"#,
    )
    .unwrap();
    let (mut client, stack, _) = connect(addr, &config).await;
    let throttle = stack.retry_throttle().unwrap().clone();
    backend.fail(u32::MAX, Code::Unavailable);

    let mut attempts_of_each_call = Vec::new();
    for _ in 0..4 {
        let before = backend.attempts();
        let status = call(&mut client, ORDER).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        attempts_of_each_call.push(backend.attempts() - before);
    }
    // 10 -> 9 (retried) -> 8; 7 (retried) -> 6; 5: throttled; 4: throttled.
    assert_eq!(attempts_of_each_call, [2, 2, 1, 1]);
    assert_eq!(throttle.tokens(), 4.0);
    assert!(!throttle.allows());
    assert_eq!(stack.retry_counters().refused_by_budget, 2);

    // Three successes: 7 tokens.
    backend.fail(0, Code::Unavailable);
    for _ in 0..3 {
        call(&mut client, ORDER).await.unwrap();
    }
    assert_eq!(throttle.tokens(), 7.0);
    assert!(throttle.allows());

    // Failing again: 6, above half, so retried; 5.
    backend.fail(u32::MAX, Code::Unavailable);
    let before = backend.attempts();
    call(&mut client, ORDER).await.unwrap_err();
    assert_eq!(backend.attempts() - before, 2, "retried again");
    assert_eq!(throttle.tokens(), 5.0);
}

/// The throttle stops hedges too: once it is at its threshold, a slow call
/// gets none, and is answered by its first attempt, 200 ms later, where a
/// hedge would have answered after 10 ms.
#[tokio::test]
async fn the_throttle_stops_hedges() {
    let (addr, backend) = start().await;
    let config = ServiceConfig::from_json(
        r#"{ "methodConfig": [
               { "name": [{ "service": "test.Search" }],
                 "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "0.01s",
                                    "nonFatalStatusCodes": ["UNAVAILABLE"] } },
               { "name": [{ "service": "test.Shop" }],
                 "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.001s",
                                  "maxBackoff": "0.001s", "backoffMultiplier": 2,
                                  "retryableStatusCodes": ["UNAVAILABLE"] } }
             ],
             "retryThrottling": { "maxTokens": 2, "tokenRatio": 0.5 } }"#,
    )
    .unwrap();
    let (mut client, stack, _) = connect(addr, &config).await;
    // Another method's failure drains the client's one throttle: 2 -> 1,
    // at the threshold, so that call is not retried either.
    backend.fail(1, Code::Unavailable);
    call(&mut client, ORDER).await.unwrap_err();
    assert!(!stack.retry_throttle().unwrap().allows());
    assert_eq!(backend.attempts(), 1);

    backend.script(|s| s.slow_first = Some(Duration::from_millis(200)));
    let receipt = call(&mut client, FIND).await.unwrap();
    assert_eq!(receipt.attempt, 1, "no hedge");
    assert_eq!(backend.attempts(), 2, "the slow call was sent once");
    assert_eq!(stack.retry_throttle().unwrap().tokens(), 1.5, "its success");
}
