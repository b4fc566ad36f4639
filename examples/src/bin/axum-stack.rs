//! An axum server with the server-side layers, whose handler calls a
//! downstream dependency through a reqwest client wrapped in the client
//! stack. Everything runs on 127.0.0.1.
//!
//! The `shop` server (the one we are building) has `server_stack("shop")`
//! on its `Router`: the caller's budget (`ServerDeadlineLayer`), a
//! bulkhead (at most 2 requests at once, the rest get 503 with
//! `Retry-After`) and a breaker for the whole server, in one `layer`. Its
//! handler calls `inventory`, a second local axum server, through
//! `client_stack("inventory")`: `ClientDeadline -> Breaker -> Retry
//! (budget) -> Bulkhead -> ClientDeadline (per attempt) -> reqwest`, and
//! turns the stack's errors into answers with `Answer::for_error`. It
//! shows:
//!
//! 1. the caller's budget propagated: `shop` receives 800 ms, works 50 ms,
//!    and `inventory` is told what is left;
//! 2. a full compartment: with two slow requests in `shop`, a third gets
//!    503 with `Retry-After` at once;
//! 3. a 504 at the deadline, with the downstream work cancelled;
//! 4. the client-side breaker: `inventory` fails, the retries and the
//!    breaker count every attempt, the circuit opens and `shop` answers
//!    503 in microseconds without calling `inventory`.
//! 5. The live view: `shop`'s ops listener serves every dependency's state
//!    as JSON and an HTML page polling it (`tower_shield::view`); fetched
//!    while the circuit is open, it says so.
//! 6. Settings from a file, reloaded on `SIGHUP`: every stack (`shop`'s
//!    server stack and its three clients, `inventory`, `pricing` and
//!    `reviews`) is built from one file, `examples/resilience.toml`
//!    (`tower_shield::settings`). The example edits its copy of the file
//!    and sends itself `SIGHUP`: the running stacks take the new settings
//!    (a larger bulkhead, a longer open period) and the open circuit stays
//!    open.
//!
//! Run it with:
//!
//! ```text
//! cargo run -p examples --bin axum-stack
//! cargo run -p examples --bin axum-stack -- --hold 30   # keep the ops listener up 30 s more
//! ```
//!
//! While it holds, `kill -HUP <pid>` after editing the settings file it
//! printed applies your edit.
//!
//! (`scripts/view-screenshot` uses `--hold` to take a headless browser's
//! picture of the live view while the circuit is open.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use examples::demo::{check, serve_local};
use tokio::time::Instant;
use tower_breaker::BoxError;
use tower_bulkhead::CompartmentHandle;
use tower_deadline::{ClientDeadlineLayer, Deadline, ServerDeadlineLayer};
use tower_shield::reqwest::{Client, ReqwestService};
use tower_shield::settings::{
    Applied, ServiceSettings, SettingsClientService, SettingsClientStack,
};
use tower_shield::stack::ServerStack;
use tower_shield::view::LiveView;

// ---------------------------------------------------------------- inventory

/// The downstream dependency: reports the budget it was given, can hang,
/// can fail.
#[derive(Clone, Default)]
struct Inventory {
    calls: Arc<AtomicUsize>,
}

/// Prints when a handler of `inventory` is dropped before it finished.
struct CancelGuard(bool);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.0 {
            println!("     inventory: handler cancelled, its work abandoned");
        }
    }
}

async fn stock(
    State(inv): State<Inventory>,
    Path(sku): Path<String>,
    headers: HeaderMap,
) -> Response {
    inv.calls.fetch_add(1, Ordering::SeqCst);
    let told = headers
        .get("x-request-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    match sku.as_str() {
        "hangs" => {
            let mut guard = CancelGuard(false);
            tokio::time::sleep(Duration::from_secs(30)).await;
            guard.0 = true;
            (StatusCode::OK, "late").into_response()
        }
        "broken" => (StatusCode::SERVICE_UNAVAILABLE, "database down").into_response(),
        _ => (
            StatusCode::OK,
            format!("{sku}: 7 in stock; budget told: {told} ms"),
        )
            .into_response(),
    }
}

async fn start_inventory(inv: Inventory) -> SocketAddr {
    let app = Router::new()
        .route("/stock/{sku}", get(stock))
        .with_state(inv)
        .layer(ServerDeadlineLayer::new().max_timeout(Duration::from_secs(10)));
    serve_local(app).await
}

// --------------------------------------------------------------------- shop

#[derive(Clone)]
struct Shop {
    inventory: SocketAddr,
    client: Client<SettingsClientService<ReqwestService>>,
}

async fn order(State(shop): State<Shop>, Path(sku): Path<String>) -> Response {
    let left = Deadline::current().map_or(0, |d| d.remaining().as_millis());
    // Some local work before calling the dependency.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let url = format!("http://{}/stock/{sku}", shop.inventory);
    let start = Instant::now();
    let sent = shop.client.get(url).send().await;
    let took = start.elapsed().as_micros();
    match sent {
        Ok(response) => {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            let text = format!("shop had {left} ms; inventory says: {text} (call: {took} us)");
            (status, text).into_response()
        }
        Err(e) => downstream_error(&e, took),
    }
}

/// Turns the client stack's typed errors into answers for our caller: 503
/// with `Retry-After` (as the breaker or bulkhead told us) and the
/// do-not-retry mark for an open circuit or a full bulkhead, 504 for a
/// passed deadline, 502 for a failed dependency.
fn downstream_error(e: &BoxError, took: u128) -> Response {
    let mut response: Response = tower_breaker::Answer::for_error(&**e).into_response(false);
    *response.body_mut() = format!("inventory unavailable: {e} (call: {took} us)").into();
    response
}

/// The client stack for calls to `inventory`: deadline, breaker, retry,
/// bulkhead, per-attempt deadline, built from the settings file (a 2 s
/// budget for the whole call, at most 16 attempts in flight, a breaker
/// that judges the last 10 calls).
fn inventory_client(stack: SettingsClientStack) -> Client<SettingsClientService<ReqwestService>> {
    // Per attempt: a fresh x-request-timeout-ms header, 1 ms for the network.
    let stack = stack.attempt_deadline(ClientDeadlineLayer::new().margin(Duration::from_millis(1)));
    // reqwest's own retries off: every attempt is one the breaker counts.
    stack.reqwest(
        ReqwestService::client_builder()
            .connect_timeout(Duration::from_millis(200))
            .build()
            .expect("a reqwest client"),
    )
}

async fn start_shop(shop: Shop, stack: ServerStack) -> SocketAddr {
    let app = Router::new()
        .route("/order/{sku}", get(order))
        .with_state(shop)
        // Outermost first: the caller's deadline, a bulkhead, a breaker.
        .layer(stack);
    serve_local(app).await
}

/// Reads the settings file (TOML).
fn read_settings(path: &std::path::Path) -> Result<ServiceSettings, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value: serde_json::Value =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    ServiceSettings::from_value(value).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reloads `path` into the running stacks on every `SIGHUP`, and sends
/// what each reload did to `done`.
#[cfg(unix)]
fn reload_on_sighup(
    mut settings: ServiceSettings,
    path: std::path::PathBuf,
    done: tokio::sync::mpsc::Sender<std::collections::BTreeMap<String, Applied>>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup()).expect("a SIGHUP handler");
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match read_settings(&path) {
                Ok(new) => {
                    let reports = settings.apply(new);
                    let _ = done.send(reports).await;
                }
                // A bad file changes nothing: the stacks keep running on
                // the settings they have.
                Err(e) => eprintln!("   settings not reloaded: {e}"),
            }
        }
    });
}

// ------------------------------------------------------------------- caller

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
    took: Duration,
}

async fn call(shop: SocketAddr, sku: &str, budget_ms: u64) -> Reply {
    let start = Instant::now();
    // A plain client, as any caller of our server would have.
    let response = reqwest::Client::new()
        .get(format!("http://{shop}/order/{sku}"))
        .header("x-request-timeout-ms", budget_ms.to_string())
        .send()
        .await
        .expect("shop answers");
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    Reply {
        status,
        headers,
        text,
        took: start.elapsed(),
    }
}

/// The duration of shop's call to inventory, from shop's answer.
fn call_micros(text: &str) -> Option<u128> {
    text.rsplit("(call: ")
        .next()
        .and_then(|t| t.trim_end_matches(" us)").parse().ok())
}

async fn wait_in_flight(handle: &CompartmentHandle, n: usize) {
    let start = Instant::now();
    while handle.in_flight() < n && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() {
    let inv = Inventory::default();
    let inventory = start_inventory(inv.clone()).await;
    // Every stack from one settings file; the example works on a copy,
    // which step 6 edits.
    let settings_path =
        std::env::temp_dir().join(format!("axum-stack-{}.toml", std::process::id()));
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/resilience.toml"),
        &settings_path,
    )
    .expect("a copy of examples/resilience.toml");
    let settings = read_settings(&settings_path).expect("valid settings");
    let (inventory_stack, _) = settings.client_stack("inventory");
    let (pricing_stack, _) = settings.client_stack("pricing");
    let (reviews_stack, _) = settings.client_stack("reviews");
    let (shop_stack, _) = settings.server_stack("shop");
    let client_breaker = inventory_stack.breaker_handle().clone();
    let inventory_bulkhead = inventory_stack.bulkhead_handle();
    let compartment = shop_stack.bulkhead_handle();
    // The ops listener: what an operator curls during an incident (mount
    // it behind your own authentication).
    let view = LiveView::new();
    view.add_client_stack(&inventory_stack);
    let _ = view
        .dependency("shop (server)")
        .bulkhead(compartment.clone());
    view.add_client_stack(&pricing_stack);
    view.add_client_stack(&reviews_stack);
    let ops = serve_local(
        Router::new()
            .route_service("/ops/resilience.json", view.json_service())
            .route_service("/ops/resilience", view.page_service("/ops/resilience.json")),
    )
    .await;
    let shop = start_shop(
        Shop {
            inventory,
            client: inventory_client(inventory_stack),
        },
        shop_stack,
    )
    .await;
    let mut failures = Vec::new();

    println!("1. The budget propagated: caller -> shop (800 ms) -> inventory");
    let a = call(shop, "apples", 800).await;
    println!("   {} in {} ms: {}", a.status, a.took.as_millis(), a.text);
    let told: Option<u64> = a
        .text
        .split("budget told: ")
        .nth(1)
        .and_then(|s| s.split(" ms").next())
        .and_then(|s| s.parse().ok());
    check(
        a.status == StatusCode::OK && told.is_some_and(|t| (500..=760).contains(&t)),
        "inventory was told what was left of 800 ms after shop's 50 ms of work",
        &mut failures,
    );

    println!("\n2. A full compartment: shop takes 2 requests at once");
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { call(shop, "hangs", 1_000).await }))
        .collect();
    wait_in_flight(&compartment, 2).await;
    println!(
        "   two requests hang in shop (in flight: {})",
        compartment.in_flight()
    );
    let c = call(shop, "apples", 800).await;
    println!(
        "   third request: {} in {} ms, retry-after: {:?}, x-tower-no-retry: {:?}",
        c.status,
        c.took.as_millis(),
        c.headers.get("retry-after"),
        c.headers.get("x-tower-no-retry")
    );
    check(
        c.status == StatusCode::SERVICE_UNAVAILABLE
            && c.headers.contains_key("retry-after")
            && c.took < Duration::from_millis(200),
        "503 with Retry-After at once, without waiting",
        &mut failures,
    );

    println!("\n3. The deadline: the two hanging requests had 1000 ms");
    for task in slow {
        let d = task.await.expect("caller task");
        println!(
            "   {} in {} ms (answered by shop's ServerDeadlineLayer)",
            d.status,
            d.took.as_millis()
        );
        check(
            d.status == StatusCode::GATEWAY_TIMEOUT && d.took < Duration::from_millis(1_500),
            "504 at the deadline",
            &mut failures,
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;

    println!("\n4. The client-side breaker: inventory answers 503 to /stock/broken");
    let s = client_breaker.snapshot();
    println!(
        "   breaker window so far: {} calls, {} failures (the two timeouts of step 3)",
        s.window.calls, s.window.failures
    );
    let before = inv.calls.load(Ordering::SeqCst);
    let mut last = None;
    for i in 1..=4 {
        let e = call(shop, "broken", 1_500).await;
        let s = client_breaker.snapshot();
        println!(
            "   request {i}: {} in {:>3} ms, of which the inventory call took {:>6} us \
             (breaker {:?}, {} attempt failures counted)",
            e.status,
            e.took.as_millis(),
            call_micros(&e.text).unwrap_or_default(),
            s.state,
            s.totals.failed
        );
        last = Some(e);
    }
    let reached = inv.calls.load(Ordering::SeqCst) - before;
    let s = client_breaker.snapshot();
    println!(
        "   inventory was called {reached} times for 4 requests; the breaker rejected {}",
        s.totals.rejected
    );
    let last = last.expect("four calls");
    println!("   last answer: {}", last.text);
    let call_us = call_micros(&last.text);
    check(
        s.totals.opened >= 1
            && reached < 4 * 3
            && last.status == StatusCode::SERVICE_UNAVAILABLE
            && last.headers.contains_key("retry-after")
            && call_us.is_some_and(|us| us < 5_000),
        "the circuit opened, and shop answers 503 at once without calling inventory",
        &mut failures,
    );

    println!("\n5. The live view: http://{ops}/ops/resilience (JSON at /ops/resilience.json)");
    let text = reqwest::get(format!("http://{ops}/ops/resilience.json"))
        .await
        .expect("the ops listener answers")
        .text()
        .await
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let inventory_state = json["dependencies"][0]["breaker"]["state"].clone();
    println!(
        "   inventory: {inventory_state}, next probe in {} ms; shop (server): {} in flight",
        json["dependencies"][0]["breaker"]["retry_after_ms"],
        json["dependencies"][1]["bulkhead"]["in_flight"]
    );
    let page = reqwest::get(format!("http://{ops}/ops/resilience"))
        .await
        .expect("the ops listener answers")
        .text()
        .await
        .unwrap_or_default();
    check(
        inventory_state == "open" && page.contains("/ops/resilience.json"),
        "the live view shows the open circuit, and its page polls the JSON",
        &mut failures,
    );

    #[cfg(unix)]
    {
        println!(
            "\n6. Settings reloaded on SIGHUP from {}",
            settings_path.display()
        );
        let (done, mut reloads) = tokio::sync::mpsc::channel(1);
        reload_on_sighup(settings, settings_path.clone(), done);
        let text = std::fs::read_to_string(&settings_path).unwrap_or_default();
        let edited = text
            .replace("bulkhead = { limit = 16 }", "bulkhead = { limit = 32 }")
            .replace(
                "minimum_calls = 6, open_period = \"2s\"",
                "minimum_calls = 6, open_period = \"3s\"",
            );
        std::fs::write(&settings_path, edited).expect("the settings copy is writable");
        println!(
            "   edited: inventory's bulkhead 16 -> 32, its open period 2 s -> 3 s; kill -HUP {}",
            std::process::id()
        );
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let reports = tokio::time::timeout(Duration::from_secs(5), reloads.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let inventory = reports.get("inventory").cloned().unwrap_or_default();
        println!(
            "   inventory: applied {:?}, not live {:?}",
            inventory.applied, inventory.not_live
        );
        let state = client_breaker.snapshot().state;
        println!(
            "   the running stack now: bulkhead limit {}, breaker {:?}",
            inventory_bulkhead.limit(),
            state
        );
        check(
            sent && inventory.applied == ["breaker.open_period", "bulkhead.limit"]
                && inventory_bulkhead.limit() == 32
                && state == tower_breaker::State::Open,
            "the file's new settings apply to the running stacks, and the open circuit stays open",
            &mut failures,
        );
    }

    if !failures.is_empty() {
        eprintln!("\nnot demonstrated: {failures:?}");
        std::process::exit(1);
    }
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--hold") {
        let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(30);
        println!("\nholding the ops listener for {secs} s at http://{ops}/ops/resilience");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    let _ = std::fs::remove_file(&settings_path);
}
