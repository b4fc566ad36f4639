//! An AWS Lambda function on the real runtime (the `lambda_runtime`
//! crate) whose dependency sits behind the full client stack, its circuit
//! shared by every instance of the function through Redis or DynamoDB.
//!
//! This is the function as you would deploy it: `main` builds a
//! [`Context`] once per cold start (the store, the `Breaker` on it, the
//! reqwest client under `client_stack`), then hands [`handler`] to
//! `lambda_runtime::run(service_fn(..))`, which asks the Runtime API at
//! `AWS_LAMBDA_RUNTIME_API` for one event after another. Each invocation
//! calls the dependency once (the stack may retry it) and ends with
//! [`Breaker::flush`]: Lambda freezes the instance as soon as the handler
//! returns, so the invocation's outcomes reach the store first. An open
//! circuit is an answer, not an error: status 503 with `retryAfterMs`; a
//! failed dependency is status 502.
//!
//! Its environment (besides the runtime's own variables,
//! `AWS_LAMBDA_FUNCTION_NAME`, `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`,
//! `AWS_LAMBDA_FUNCTION_VERSION` and `AWS_LAMBDA_RUNTIME_API`):
//!
//! | variable | what | default |
//! |---|---|---|
//! | `CIRCUIT_STORE` | `redis://HOST:PORT`, or `dynamodb=ENDPOINT` (a DynamoDB-compatible endpoint; the table must exist) | required |
//! | `CIRCUIT_TABLE` | the DynamoDB table | `circuits` |
//! | `DEPENDENCY_URL` | what each invocation calls (`GET`) | required |
//! | `OPEN_PERIOD_MS` | the breaker's first open period | 5000 |
//! | `MINIMUM_CALLS` | calls in the window before it is judged | 10 |
//! | `WINDOW_SECS` | the window: this many buckets of 1 s | 10 |
//! | `REFRESH_INTERVAL_MS` | how often, at most, the store is read; an instance idle longer reads it before its next call | 250 |
//!
//! The answer is JSON: `statusCode`, `body`, `retryAfterMs` (for a 503),
//! `probe` (this invocation was the fleet's probe: it won the election at
//! the end of an open period), `circuit` (the circuit after the
//! invocation) and `storeRequests` (what the invocation asked of
//! DynamoDB; absent with Redis). The dependency call carries the
//! invocation's request id in `x-request-id`.
//!
//! Against AWS the DynamoDB client comes from
//! `aws_config::load_from_env().await` rather than an endpoint. Here the
//! test `tests/lambda_emulator.rs` runs this executable as a fleet of
//! instances under a Runtime API emulator on 127.0.0.1 (frozen between
//! invocations, scaled in and out), against its own `redis-server` or
//! `moto_server`:
//!
//! ```text
//! cargo test -p examples --test lambda_emulator -- --nocapture
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use lambda_runtime::{service_fn, Diagnostic, LambdaEvent};
use serde::{Deserialize, Serialize};
use tower_breaker::error::CircuitOpen;
use tower_breaker::snapshot::Cause;
use tower_breaker::store::Store;
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, State, Transition};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};
use tower_breaker_redis::{RedisOptions, RedisStore};
use tower_shield::reqwest::{Client, ReqwestService};
use tower_shield::stack::{client_stack, ClientStackService};

/// Lambda's error type.
type Error = lambda_runtime::Error;

/// The breaker's name: one circuit for every instance of the function.
const BREAKER: &str = "inventory";
/// The longest a call of the dependency may take (the whole call,
/// retries included); less when the invocation's deadline is nearer.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The invocation's input: an order to check against the inventory.
#[derive(Debug, Deserialize)]
struct Event {
    order: u64,
}

/// The invocation's answer, as API Gateway's proxy integration expects it
/// (`statusCode`, `body`), plus what the breaker did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status_code: u16,
    body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u128>,
    probe: bool,
    circuit: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_requests: Option<u64>,
}

/// What the function reads from its environment at its cold start.
#[derive(Debug)]
struct Settings {
    store: String,
    table: String,
    dependency_url: String,
    open_period: Duration,
    minimum_calls: u32,
    window_secs: usize,
    refresh_interval: Duration,
}

impl Settings {
    fn from_env() -> Result<Self, Error> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let number = |name: &str, default: u64| -> Result<u64, Error> {
            match std::env::var(name) {
                Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v}: {e}"))?),
                Err(_) => Ok(default),
            }
        };
        Ok(Self {
            store: var("CIRCUIT_STORE")?,
            table: std::env::var("CIRCUIT_TABLE").unwrap_or_else(|_| "circuits".to_owned()),
            dependency_url: var("DEPENDENCY_URL")?,
            open_period: Duration::from_millis(number("OPEN_PERIOD_MS", 5000)?),
            minimum_calls: u32::try_from(number("MINIMUM_CALLS", 10)?)?,
            window_secs: usize::try_from(number("WINDOW_SECS", 10)?)?,
            refresh_interval: Duration::from_millis(number("REFRESH_INTERVAL_MS", 250)?),
        })
    }
}

/// What an instance builds once, at its cold start, and keeps across
/// invocations (Lambda freezes it between them).
#[derive(Debug)]
struct Context {
    breaker: Breaker,
    client: Client<ClientStackService<ReqwestService>>,
    dependency_url: String,
    /// The DynamoDB store, for its request counts.
    dynamodb: Option<Arc<DynamoDbStore>>,
    /// The transitions of the invocation running, told by the listener.
    transitions: Arc<Mutex<Vec<(State, Cause)>>>,
}

impl Context {
    /// The cold start: the store named by `CIRCUIT_STORE`, the breaker on
    /// it, the client stack around reqwest; then one read of the store, so
    /// that an instance started while the circuit is open rejects from its
    /// first invocation.
    async fn cold_start(settings: &Settings) -> Result<Self, Error> {
        let (store, dynamodb): (Arc<dyn Store>, _) =
            if let Some(endpoint) = settings.store.strip_prefix("dynamodb=") {
                let options = DynamoDbOptions::new()
                    .table(settings.table.as_str())
                    // A local moto on a busy machine; against DynamoDB in
                    // the same region keep the default (200 ms).
                    .timeout(Duration::from_secs(1));
                let store = Arc::new(DynamoDbStore::new(dynamodb_client(endpoint), options)?);
                (store.clone(), Some(store))
            } else if settings.store.starts_with("redis://") {
                // 200 ms rather than the default 50: a loaded 2-core
                // machine runs the whole fleet and the server.
                let options = RedisOptions::new().timeout(Duration::from_millis(200));
                (
                    Arc::new(RedisStore::connect(&settings.store, options).await?),
                    None,
                )
            } else {
                return Err(format!(
                    "CIRCUIT_STORE={}: expected redis://HOST:PORT or dynamodb=ENDPOINT",
                    settings.store
                )
                .into());
            };
        let transitions = Arc::new(Mutex::new(Vec::new()));
        let told = transitions.clone();
        let fleet = FleetConfig::new(store)
            .refresh_interval(settings.refresh_interval)
            // An instance is thawed for each invocation after an idle
            // while: a decision older than one refresh interval is read
            // again before the call, so an opening elsewhere is not missed.
            .max_staleness(settings.refresh_interval)
            .flush_timeout(Duration::from_secs(2));
        let config = BreakerConfig::new()
            .time_window(settings.window_secs, Duration::from_secs(1))
            .minimum_calls(settings.minimum_calls)
            .failure_rate(0.5)
            .open_period(settings.open_period)
            // A probe is one call of at most CALL_TIMEOUT.
            .max_half_open_wait(CALL_TIMEOUT * 2)
            .fleet(fleet)
            .listener(move |t: &Transition| {
                if let Ok(mut told) = told.lock() {
                    told.push((t.to, t.cause));
                }
            });
        let breaker = Breaker::try_with_config(BREAKER, config)?;
        breaker.refresh().await?;
        let client = client_stack(BREAKER)
            .breaker(breaker.clone())
            .timeout(CALL_TIMEOUT)
            .reqwest(
                ReqwestService::client_builder()
                    .connect_timeout(Duration::from_millis(200))
                    .build()?,
            );
        Ok(Self {
            breaker,
            client,
            dependency_url: settings.dependency_url.clone(),
            dynamodb,
            transitions,
        })
    }
}

/// A DynamoDB client for `endpoint`, with a fixed region and static
/// credentials (a local DynamoDB-compatible server accepts any). In AWS:
/// `aws_sdk_dynamodb::Client::new(&aws_config::load_from_env().await)`.
fn dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "lambda"))
        .endpoint_url(endpoint)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The function: one call of the dependency through the stack, then the
/// flush, then the answer.
async fn handler(event: LambdaEvent<Event>, ctx: &Context) -> Result<Answer, Diagnostic> {
    let before = ctx.dynamodb.as_ref().map(|s| s.usage());
    if let Ok(mut told) = ctx.transitions.lock() {
        told.clear();
    }
    let mut answer = check_inventory(&event, ctx).await;
    // Lambda may freeze the instance as soon as this returns: the
    // invocation's outcomes (and an opening or a close it caused) reach
    // the store first.
    if let Err(left) = ctx.breaker.flush().await {
        eprintln!("{}: {left}", event.context.request_id);
    }
    // The fleet's probe: this instance won the election when the open
    // period ended, and its call went out.
    answer.probe = ctx.transitions.lock().is_ok_and(|told| {
        told.iter()
            .any(|&(to, cause)| to == State::HalfOpen && cause == Cause::OpenPeriodOver)
    });
    answer.circuit = match ctx.breaker.snapshot().state {
        State::Closed => "closed",
        State::Open => "open",
        State::HalfOpen => "half_open",
    };
    if let (Some(store), Some(before)) = (&ctx.dynamodb, before) {
        let after = store.usage();
        answer.store_requests = Some(after.reads + after.writes - before.reads - before.writes);
    }
    Ok(answer)
}

/// The invocation's work: the dependency's answer, a rejection by the
/// open circuit, or the failure, as a well-formed answer each.
async fn check_inventory(event: &LambdaEvent<Event>, ctx: &Context) -> Answer {
    let order = event.payload.order;
    let left = event
        .context
        .deadline()
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let called = ctx
        .client
        .get(&ctx.dependency_url)
        .header("x-request-id", event.context.request_id.as_str())
        .timeout(CALL_TIMEOUT.min(left))
        .send()
        .await;
    let answer = |status_code, body| Answer {
        status_code,
        body,
        retry_after_ms: None,
        probe: false,
        circuit: "closed",
        store_requests: None,
    };
    match called {
        Ok(response) if response.status().is_success() => match response.text().await {
            Ok(text) => answer(200, format!("order {order}: {text}")),
            Err(e) => answer(502, format!("order {order}: inventory failed: {e}")),
        },
        Ok(response) => answer(
            502,
            format!("order {order}: inventory answered {}", response.status()),
        ),
        Err(e) => match e.downcast_ref::<CircuitOpen>() {
            Some(open) => Answer {
                retry_after_ms: Some(open.retry_after().as_millis()),
                ..answer(
                    503,
                    format!("order {order}: inventory unavailable ({open})"),
                )
            },
            None => answer(502, format!("order {order}: inventory failed: {e}")),
        },
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let ctx = match Settings::from_env() {
        Ok(settings) => Context::cold_start(&settings).await,
        Err(e) => Err(e),
    };
    let ctx = match ctx {
        Ok(ctx) => ctx,
        Err(e) => {
            init_error(&e).await;
            return Err(e);
        }
    };
    let ctx = &ctx;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        handler(event, ctx).await
    }))
    .await
}

/// Tells the Runtime API that the cold start failed (`/init/error`), as a
/// runtime does before it exits; Lambda then fails the invocation that
/// was waiting for this instance.
async fn init_error(e: &Error) {
    let Ok(api) = std::env::var("AWS_LAMBDA_RUNTIME_API") else {
        return;
    };
    let diagnostic = serde_json::json!({
        "errorType": "Runtime.InitError",
        "errorMessage": e.to_string(),
    });
    let posted = async {
        reqwest::Client::new()
            .post(format!("http://{api}/2018-06-01/runtime/init/error"))
            .header("lambda-runtime-function-error-type", "Runtime.InitError")
            .body(diagnostic.to_string())
            .send()
            .await
    };
    if let Err(e) = posted.await {
        eprintln!("could not report the init error: {e}");
    }
}
