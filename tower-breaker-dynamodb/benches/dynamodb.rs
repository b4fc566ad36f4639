//! The closed path with a DynamoDB store: `Breaker::try_acquire` plus
//! `Permit::record(Success)` with no store, with a `MemoryStore`, and with
//! a `DynamoDbStore` (the per-process cache on: no request on the path of a
//! call), one thread, in one run; allocations per call; and, for
//! reference, the cost of one store call of each kind (`read`, `report`)
//! against a local `moto_server`.
//!
//! Run with
//! `cargo bench -p tower-breaker-dynamodb --bench dynamodb`;
//! `moto_server` (`pip install 'moto[server]'`) should be on the `PATH`:
//! the bench starts its own on a free port of 127.0.0.1 and kills it at the
//! end. Without it the bench says `skipped: moto_server not found` and
//! measures only the variants without a DynamoDB store.
//!
//! The store-call figures are **moto on loopback, not DynamoDB**: a Python
//! server on the same (busy) machine, with no network in between. They
//! show what the SDK and the store cost around a request, not what a
//! request to DynamoDB costs (it crosses a network, and DynamoDB is not
//! moto).
//!
//! The DynamoDB variants of the closed path:
//!
//! - `refresh 1 h`: the breaker read the store once before the group and
//!   is not due to read again, so the measured iterations make no request
//!   at all (checked with `DynamoDbStore::usage` after the group);
//! - `refresh 1 s (default)`: the default interval, as in the Redis bench:
//!   about once a second, the first call after the interval spawns a
//!   report on the runtime's worker and does not wait for it (one
//!   `UpdateItem`); the requests made are printed after the group.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::alloc::System;
use std::hint::black_box;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region as AwsRegion};
use criterion::{criterion_group, criterion_main, Criterion};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::runtime::Runtime;
use tokio::time::Instant;
use tower_breaker::store::{FleetRule, MemoryStore, Report, Store};
use tower_breaker::FleetConfig;
use tower_breaker::{Breaker, BreakerConfig, Outcome};
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore, Usage};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const TABLE: &str = "tower-breaker-bench";

/// A private moto_server, killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a moto_server on a free port of 127.0.0.1, or returns `None`
/// when there is none to start (not on the `PATH`, or a shim that exits
/// at once).
fn start_moto() -> Option<Moto> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut moto = Moto { child, port };
    for _ in 0..1500 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(moto);
        }
        if moto.child.try_wait().ok().flatten().is_some() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "moto_server on port {} did not start within 30 s",
        moto.port
    );
}

/// A store on the moto server's bench table, with its own usage counters.
/// The timeout is generous: the server is a Python process on this
/// machine.
fn dynamodb_store(moto: &Moto) -> DynamoDbStore {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(AwsRegion::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .endpoint_url(format!("http://127.0.0.1:{}", moto.port))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let options = DynamoDbOptions::new()
        .table(TABLE)
        .timeout(Duration::from_secs(5));
    DynamoDbStore::new(client, options).expect("valid options")
}

/// Requests made between two usage readings.
fn requests(before: Usage, after: Usage) -> u64 {
    (after.reads - before.reads) + (after.writes - before.writes)
}

fn closed_call(breaker: &Breaker) {
    breaker
        .try_acquire()
        .expect("closed")
        .record(Outcome::Success);
}

/// Allocations per closed-path call of `breaker`, over many calls.
fn allocations(breaker: &Breaker) -> f64 {
    const CALLS: u64 = 100_000;
    let region = Region::new(GLOBAL);
    for _ in 0..CALLS {
        closed_call(black_box(breaker));
    }
    region.change().allocations as f64 / CALLS as f64
}

/// A breaker variant: its name, the breaker, and its DynamoDB store (to
/// read its usage), if any.
struct Variant {
    name: &'static str,
    breaker: Breaker,
    dynamodb: Option<Arc<DynamoDbStore>>,
    /// Not due to refresh during the bench: must make no request.
    no_request: bool,
}

fn variants(moto: Option<&Moto>) -> Vec<Variant> {
    let mut variants = vec![
        Variant {
            name: "no store",
            breaker: Breaker::new("bench"),
            dynamodb: None,
            no_request: false,
        },
        Variant {
            name: "memory store, cached 1 s",
            breaker: Breaker::with_config(
                "bench",
                BreakerConfig::new().store(Arc::new(MemoryStore::new())),
            ),
            dynamodb: None,
            no_request: false,
        },
    ];
    if let Some(moto) = moto {
        for (name, refresh) in [
            ("dynamodb store, refresh 1 h", Duration::from_secs(3600)),
            (
                "dynamodb store, refresh 1 s (default)",
                Duration::from_secs(1),
            ),
        ] {
            let store = Arc::new(dynamodb_store(moto));
            let config = BreakerConfig::new()
                .fleet(FleetConfig::new(store.clone()).refresh_interval(refresh));
            variants.push(Variant {
                name,
                breaker: Breaker::try_with_config("bench", config).expect("a valid name"),
                dynamodb: Some(store),
                no_request: refresh > Duration::from_secs(60),
            });
        }
    }
    variants
}

fn usage_of(variant: &Variant) -> Option<Usage> {
    variant.dynamodb.as_ref().map(|s| s.usage())
}

fn closed_path(c: &mut Criterion, rt: &Runtime, moto: Option<&Moto>) {
    let variants = variants(moto);
    for v in &variants {
        rt.block_on(v.breaker.refresh()).expect("first read");
    }

    println!("\nallocations per closed-path call (100 000 calls):");
    for v in &variants {
        let before = usage_of(v);
        let allocs = allocations(&v.breaker);
        let made = before.map(|b| requests(b, usage_of(v).unwrap()));
        match made {
            Some(n) => println!("  {:<40} {allocs:.3}  ({n} store requests)", v.name),
            None => println!("  {:<40} {allocs:.3}", v.name),
        }
    }

    let before: Vec<_> = variants.iter().map(usage_of).collect();
    let mut group = c.benchmark_group("closed path");
    for v in &variants {
        group.bench_function(v.name, |b| b.iter(|| closed_call(black_box(&v.breaker))));
    }
    group.finish();
    // The spawned reports of the 1 s variant may still be in flight.
    std::thread::sleep(Duration::from_millis(200));

    println!("\nstore requests made during the closed-path group:");
    for (v, before) in variants.iter().zip(before) {
        let t = v.breaker.snapshot().totals;
        let after = usage_of(v);
        let made = before.zip(after).map(|(b, a)| requests(b, a));
        match before.zip(after) {
            Some((b, a)) => println!(
                "  {:<40} {} reads + {} writes ({} refused), {} calls, {} store errors",
                v.name,
                a.reads - b.reads,
                a.writes - b.writes,
                a.refused - b.refused,
                t.successful,
                t.store_errors
            ),
            None => println!(
                "  {:<40} {} calls, {} store errors",
                v.name, t.successful, t.store_errors
            ),
        }
        if v.no_request {
            assert_eq!(made, Some(0), "the cached closed path made a request");
        }
    }
}

/// A rule the bench's reports (successes only) never break.
fn rule() -> FleetRule {
    FleetRule::new(10, Duration::from_secs(1), Duration::from_secs(5)).with_minimum_calls(10)
}

const REPORT: Report = Report::new(1, 0, 0);

/// The time of `n` calls of `op`, one after the other.
fn store_calls<F>(rt: &Runtime, n: u64, mut op: impl FnMut() -> F) -> Duration
where
    F: std::future::Future<Output = ()>,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..n {
            op().await;
        }
        start.elapsed()
    })
}

fn one_store_call(c: &mut Criterion, rt: &Runtime, moto: &Moto) {
    let store = dynamodb_store(moto);
    let name = "bench-store-calls";
    // The item exists, with a window, before either is measured.
    rt.block_on(store.report(name, REPORT, rule()))
        .expect("first report");

    let read = || async {
        black_box(store.read(name).await.expect("read"));
    };
    let report = || async {
        black_box(store.report(name, REPORT, rule()).await.expect("report"));
    };

    println!("\nallocations per store call (moto on loopback, not DynamoDB; 200 calls):");
    for (kind, n) in [("read", 200), ("report", 200)] {
        let before = store.usage();
        let region = Region::new(GLOBAL);
        match kind {
            "read" => store_calls(rt, n, read),
            _ => store_calls(rt, n, report),
        };
        let allocs = region.change().allocations as f64 / n as f64;
        let after = store.usage();
        println!(
            "  {kind:<8} {allocs:.1} allocations, {:.2} reads + {:.2} writes ({:.2} refused) per call",
            (after.reads - before.reads) as f64 / n as f64,
            (after.writes - before.writes) as f64 / n as f64,
            (after.refused - before.refused) as f64 / n as f64
        );
    }

    let mut group = c.benchmark_group("one store call (moto on loopback, not DynamoDB)");
    group.sample_size(20);
    group.bench_function("read (GetItem)", |b| {
        b.iter_custom(|iters| store_calls(rt, iters, read))
    });
    group.bench_function("report (UpdateItem)", |b| {
        b.iter_custom(|iters| store_calls(rt, iters, report))
    });
    group.finish();
    let usage = store.usage();
    println!(
        "\nstore calls group: {} reads, {} writes, {} refused ({:.1} read units, {:.1} write units reported)",
        usage.reads, usage.writes, usage.refused, usage.read_units, usage.write_units
    );
}

fn dynamodb(c: &mut Criterion) {
    let moto = start_moto();
    if moto.is_none() {
        println!("skipped: moto_server not found (benching no store and MemoryStore only)");
    }
    // Store calls are spawned on this runtime's worker; the benched loop
    // runs on the main thread inside its context.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    if let Some(moto) = &moto {
        rt.block_on(dynamodb_store(moto).create_table())
            .expect("create the bench table");
    }
    closed_path(c, &rt, moto.as_ref());
    if let Some(moto) = &moto {
        one_store_call(c, &rt, moto);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = dynamodb
}
criterion_main!(benches);
