//! The closed path with a shared store: `Breaker::try_acquire` plus
//! `Permit::record(Success)` with no store, with a `MemoryStore`, and with a
//! `RedisStore` on a private `redis-server` (the per-process cache on, its
//! default 1 s refresh interval), one thread.
//!
//! Run with
//! `cargo bench -p tower-breaker-redis --bench redis`;
//! `redis-server` must be on the `PATH` (the bench starts its own on a free
//! port of 127.0.0.1 and kills it at the end).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use resilience_testkit::redis::RedisServer;
use tower_breaker::store::MemoryStore;
use tower_breaker::{Breaker, BreakerConfig, Outcome};
use tower_breaker_redis::{RedisOptions, RedisStore};

/// The bench's own redis-server (the workspace's launcher), killed on
/// drop, and its URL.
fn start_redis() -> (RedisServer, String) {
    let server = RedisServer::start();
    let url = server.url();
    (server, url)
}

fn closed_path(c: &mut Criterion) {
    let (_server, url) = start_redis();
    // Store reads are spawned on this runtime's worker; the benched loop
    // runs on the main thread inside its context.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let redis = rt
        .block_on(RedisStore::connect(&url, RedisOptions::new()))
        .expect("connect");

    let breakers = [
        ("no store", Breaker::new("bench")),
        (
            "memory store",
            Breaker::with_config(
                "bench",
                BreakerConfig::new().store(Arc::new(MemoryStore::new())),
            ),
        ),
        (
            "redis store, cached 1 s",
            Breaker::with_config("bench", BreakerConfig::new().store(Arc::new(redis))),
        ),
    ];
    let mut group = c.benchmark_group("closed path");
    for (name, breaker) in &breakers {
        rt.block_on(breaker.refresh()).expect("first read");
        group.bench_function(*name, |b| {
            b.iter(|| {
                breaker
                    .try_acquire()
                    .expect("closed")
                    .record(Outcome::Success)
            })
        });
    }
    group.finish();
    for (name, breaker) in &breakers {
        let t = breaker.snapshot().totals;
        println!(
            "{name}: {} calls, {} store errors",
            t.successful, t.store_errors
        );
    }
}

criterion_group!(benches, closed_path);
criterion_main!(benches);
