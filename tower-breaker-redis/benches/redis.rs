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

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower_breaker::store::MemoryStore;
use tower_breaker::{Breaker, BreakerConfig, Outcome};
use tower_breaker_redis::{RedisOptions, RedisStore};

/// A private redis-server, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Server, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = Server(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH"),
    );
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..500 {
        let ping = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if ping.is_ok() {
            return (server, url);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start");
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
