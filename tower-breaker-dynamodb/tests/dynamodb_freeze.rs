//! An instance frozen between invocations, as AWS Lambda freezes one as
//! soon as its handler returns: an OS process (this test binary again)
//! runs "invocations" on the parent's word, and the parent SIGSTOPs it as
//! soon as each one has returned and SIGCONTs it later than the store's
//! timeout. A real `moto_server` (DynamoDB) on a free port holds the
//! fleet's window. (The same test as the Redis store's `redis_freeze`.)

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use support::moto_server::{client_for, MotoServer};
use support::*;
use tower::{service_fn, BoxError, Service, ServiceExt};
use tower_breaker::{Breaker, FleetConfig, FlushLayer, Outcome};
use tower_breaker_conformance::frozen::{serve, Instance};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

const CHILD: &str = "TOWER_BREAKER_DYNAMODB_FROZEN";
const TABLE: &str = "frozen";
/// Invocations, and calls per invocation (the last one fails: its report
/// starts as the handler returns, and is in flight when the instance is
/// frozen).
const INVOCATIONS: u64 = 6;
const CALLS: u64 = 5;
/// The store's timeout (moto is a Python server on a busy machine: a
/// report must not time out for being slow), and how long each freeze
/// lasts: longer.
const STORE_TIMEOUT: Duration = Duration::from_millis(1_000);
const FROZEN: Duration = Duration::from_millis(1_200);

/// The calls the fleet's window holds in `item`: the sum of its buckets
/// (`w<tick>` = calls + failures x 10^12 + slow x 10^24).
fn window_calls(item: &HashMap<String, AttributeValue>) -> (u64, u64) {
    const PACK: u128 = 1_000_000_000_000;
    item.iter()
        .filter(|(attr, _)| attr.starts_with('w') && attr[1..].parse::<u64>().is_ok())
        .map(|(_, v)| {
            let packed: u128 = v.as_n().unwrap().parse().unwrap();
            ((packed % PACK) as u64, ((packed / PACK) % PACK) as u64)
        })
        .fold((0, 0), |(c, f), (dc, df)| (c + dc, f + df))
}

/// The breaker's item, behind the store's back.
async fn record(server: &MotoServer, key: &str) -> HashMap<String, AttributeValue> {
    server
        .client()
        .get_item()
        .table_name(TABLE)
        .key("pk", AttributeValue::S(key.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap_or_default()
}

/// The instance: on each line from the parent, one invocation of
/// [`CALLS`] calls through its breaker (behind `FlushLayer` when the
/// parent says `flush`), then `returned` on stdout. A no-op without
/// `TOWER_BREAKER_DYNAMODB_FROZEN`.
#[test]
fn instance_process_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (url, mode) = spec.split_once(' ').unwrap();
    let flush = mode == "flush";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let options = DynamoDbOptions::new().table(TABLE).timeout(STORE_TIMEOUT);
        let store = Arc::new(DynamoDbStore::new(client_for(url), options).unwrap());
        let fleet = FleetConfig::new(store).refresh_interval(secs(3600));
        // A minute's window that never trips: the test counts, nothing else.
        let breaker = Breaker::with_config(
            "frozen",
            config()
                .time_window(60, secs(1))
                .minimum_calls(1_000_000)
                .fleet(fleet.clone()),
        );
        let handler = service_fn(move |_: ()| {
            let breaker = breaker.clone();
            async move {
                for i in 1..=CALLS {
                    let permit = breaker.try_acquire()?;
                    tokio::task::yield_now().await;
                    permit.record(if i == CALLS {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    });
                }
                Ok::<_, BoxError>(())
            }
        });
        let mut handler = tower::ServiceBuilder::new()
            .option_layer(flush.then(|| FlushLayer::new(fleet.clone())))
            .service(handler);
        serve(async || {
            handler.ready().await.unwrap().call(()).await.unwrap();
        })
        .await;
        // The instance's last act before it is shut down.
        fleet.flush().await.unwrap();
        println!("flushed");
    });
}

/// Runs the instance through [`INVOCATIONS`] invocations, each followed by
/// a freeze; returns the fleet's (calls, failures) as seen while the
/// instance was frozen after each one, and at the end.
async fn invocations(server: &MotoServer, mode: &str) -> (Vec<(u64, u64)>, (u64, u64)) {
    let options = DynamoDbOptions::new().table(TABLE);
    let store = server.store(TABLE, options).await;
    let key = store.key("frozen").unwrap();
    let mut instance = Instance::spawn(
        "instance_process_role",
        CHILD,
        &format!("{} {mode}", server.url()),
    );
    let mut while_frozen = Vec::new();
    for _ in 0..INVOCATIONS {
        instance.invoke();
        // Frozen as soon as the handler returned.
        instance.freeze();
        tokio::time::sleep(FROZEN).await;
        if mode == "flush" {
            // (Only then: moto serves one request at a time, and a plain
            // instance may be frozen in the middle of sending one, which
            // holds moto until the thaw, as a frozen client holds a
            // connection of a real server.)
            while_frozen.push(window_calls(&record(server, &key).await));
        }
        instance.thaw();
    }
    let took = instance.exit("flushed");
    println!(
        "{mode}: an invocation of {CALLS} calls took {took} us (median of {INVOCATIONS}; the \
         first, a cold connection, included)"
    );
    (while_frozen, window_calls(&record(server, &key).await))
}

fn expected(invocations: u64) -> (u64, u64) {
    (invocations * CALLS, invocations)
}

/// The case: reports pending when the instance is frozen, thawed
/// after the store's timeout. Nothing is lost, nothing is counted twice:
/// the fleet's totals equal the calls made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_loses_no_report() {
    let Some(server) = MotoServer::start_or_skip("a_frozen_instance_loses_no_report") else {
        return;
    };
    let (_, end) = invocations(&server, "plain").await;
    assert_eq!(end, expected(INVOCATIONS));
    println!("frozen instance, no flush layer: the fleet's window holds {end:?} at the end");
}

/// The serverless mode: behind `FlushLayer`, each invocation's outcomes
/// are in the store before its handler returns, so the fleet counts them
/// while the instance is frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_flush_layer_a_frozen_instance_has_reported_everything() {
    let Some(server) = MotoServer::start_or_skip(
        "behind_the_flush_layer_a_frozen_instance_has_reported_everything",
    ) else {
        return;
    };
    let (while_frozen, end) = invocations(&server, "flush").await;
    for (i, seen) in while_frozen.iter().enumerate() {
        assert_eq!(
            *seen,
            expected(i as u64 + 1),
            "frozen after invocation {}",
            i + 1
        );
    }
    assert_eq!(end, expected(INVOCATIONS));
}
