//! Pushes under a SUBSCRIBE the server refuses: a Redis 7 user without
//! channel rights (`resetchannels`, the default ACL) makes every SUBSCRIBE
//! fail. The subscriber must back off between attempts instead of
//! reconnecting in a loop against the shared server, while the breakers'
//! reads and writes go on working.

mod support;

use std::sync::Arc;

use support::redis_topology::{free_port, tools_or_skip, Proc, TempDir};
use support::*;
use tower_breaker::{Breaker, BreakerConfig, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore};

/// The server's count of accepted connections since it started.
fn connections_received(port: u16) -> u64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a client");
    let mut conn = client
        .get_connection()
        .expect("a connection as the default user");
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut conn)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_refused_by_the_acl_backs_off_and_the_breakers_keep_working() {
    let test = "a_subscribe_refused_by_the_acl_backs_off_and_the_breakers_keep_working";
    if !tools_or_skip(test, &["redis-server"]) {
        return;
    }
    let dir = TempDir::new("push-acl");
    let port = free_port();
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--user",
        "breakers",
        "on",
        ">secret",
        "~*",
        "resetchannels",
        "+@all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _server = Proc::redis_server(&args, port, dir.file("redis.log"));
    let url = format!("redis://breakers:secret@127.0.0.1:{port}");

    let before = connections_received(port);
    let mut breakers = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&url, RedisOptions::new())
            .await
            .expect("the user may run the scripts");
        let config = BreakerConfig::new()
            .count_window(4)
            .minimum_calls(4)
            .store(Arc::new(store));
        let breaker = Breaker::try_with_config("acl", config).expect("a breaker");
        breaker.refresh().await.expect("reads work without pushes");
        breakers.push(breaker);
    }
    tokio::time::sleep(secs(5)).await;
    let during = connections_received(port) - before;
    // Each store opens its command connection once and retries its pub/sub
    // connection at 50 ms, 100 ms, ... doubling to 2 s: about 8 attempts in
    // 5 s. A loop without backoff makes thousands.
    println!("push-acl: {during} connections in 5 s for 3 stores whose SUBSCRIBE is refused");
    assert!(
        during <= 3 * 12,
        "{during} connections in 5 s: the subscriber reconnects in a loop"
    );

    // The breakers still share their decisions through reads and writes.
    let first = &breakers[0];
    while state(first) != State::Open {
        first
            .try_acquire()
            .expect("closed until it trips")
            .record(Outcome::Failure);
    }
    tokio::time::sleep(ms(200)).await;
    breakers[1].refresh().await.expect("a read");
    assert_eq!(
        state(&breakers[1]),
        State::Open,
        "the opening, learnt by a read"
    );
}
