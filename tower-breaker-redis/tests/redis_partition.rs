//! One process cut off from Redis by a partition that sends no FIN or RST
//! (an in-test proxy that stops forwarding and closes nothing), beside a
//! process that still reaches Redis. A real `redis-server` on a free port;
//! real time.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::proxy::Proxy;
use support::redis_server::RedisServer;
use support::*;
use tokio::time::{sleep, Instant};
use tower_breaker::{Breaker, BreakerConfig, FleetConfig, Outcome, State};
use tower_breaker_redis::{RedisOptions, RedisStore};

const REFRESH: Duration = Duration::from_millis(100);

fn on(store: Arc<RedisStore>) -> BreakerConfig {
    config()
        .count_window(2)
        .minimum_calls(2)
        .open_period(secs(30))
        .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
}

/// A store on `url` (Redis itself, or the proxy in front of it).
async fn connect(url: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::connect(url, RedisOptions::new())
            .await
            .expect("connect"),
    )
}

/// Waits until the server at `url` has `n` subscriptions to its channels
/// (each breaker's push connection subscribes to its key's channel after
/// it is built, on a task of its own): a decision published before then is
/// lost to a process that is not yet listening.
async fn subscribed(url: &str, n: usize) {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let start = Instant::now();
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut con)
            .await
            .expect("PUBSUB CHANNELS");
        let mut total = 0;
        if !channels.is_empty() {
            let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channels)
                .query_async(&mut con)
                .await
                .expect("PUBSUB NUMSUB");
            total = counts.iter().map(|(_, n)| n).sum();
        }
        if total >= n {
            return;
        }
        assert!(
            start.elapsed() < secs(10),
            "{total} of {n} push subscriptions after 10 s"
        );
        sleep(ms(5)).await;
    }
}

/// While cut off, the process's calls never wait on the store (each is
/// admitted at once: the breaker fails open) and its store alarm counts
/// the timeouts; after three unanswered calls it gives up on the silent
/// connection and dials again (before, it kept the dead connection until
/// the kernel gave up on it, many minutes later). Once the partition
/// heals it follows the opening the rest of the fleet made meanwhile,
/// within about a refresh interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_process_replaces_its_dead_connection_and_follows_the_fleet_after_the_heal() {
    let Some(server) = RedisServer::start_or_skip(
        "a_partitioned_process_replaces_its_dead_connection_and_follows_the_fleet_after_the_heal",
    ) else {
        return;
    };
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let cut_off = Breaker::with_config("partition", on(connect(&proxy.url()).await));
    let other = Breaker::with_config("partition", on(connect(&server.url()).await));
    cut_off.refresh().await.unwrap();
    other.refresh().await.unwrap();
    subscribed(&server.url(), 2).await; // the push connections too
    let dialled = proxy.accepted();

    proxy.partition();
    let cut = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut replaced = None;
    while cut.elapsed() < ms(1500) {
        let call = Instant::now();
        cut_off
            .try_acquire()
            .expect("fails open: every call admitted")
            .record(Outcome::Success);
        slowest = slowest.max(call.elapsed());
        if replaced.is_none() && proxy.accepted() > dialled {
            replaced = Some(cut.elapsed());
        }
        sleep(ms(10)).await;
    }
    let errors = cut_off.snapshot().totals.store_errors;
    assert!(errors >= 3, "the store alarm: {errors} store errors");
    let replaced = replaced.expect("the silent connection was replaced");
    assert!(replaced <= secs(1), "replaced {replaced:?} after the cut");
    assert!(slowest < ms(20), "a call waited {slowest:?}");

    // The rest of the fleet opens the circuit; the cut-off process cannot
    // know yet.
    for _ in 0..2 {
        other.try_acquire().unwrap().record(Outcome::Failure);
    }
    sleep(ms(100)).await;
    assert_eq!(state(&other), State::Open);
    assert_eq!(state(&cut_off), State::Closed);

    proxy.heal();
    let healed = Instant::now();
    while let Ok(permit) = cut_off.try_acquire() {
        permit.record(Outcome::Ignored);
        assert!(healed.elapsed() < secs(5), "never followed the fleet");
        sleep(ms(5)).await;
    }
    let followed = healed.elapsed();
    assert!(followed <= secs(1), "followed {followed:?} after the heal");
    println!(
        "partition: calls never waited (slowest {slowest:?}), {errors} store errors, the dead connection replaced {replaced:?} after the cut, the fleet's opening followed {followed:?} after the heal (refresh interval {REFRESH:?})"
    );
}

/// A quiet process (it makes no call, hence no periodic read) whose store
/// connections go down while the rest of the fleet closes the circuit:
/// the close is published while its push connection is away, and lost to
/// it. When its connection comes back it reads the decision again and
/// closes, without a call. Before, it read "open" until its next call (a
/// Redis restart does the same to every subscriber).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_process_reads_again_when_its_push_connection_comes_back() {
    let Some(server) = RedisServer::start_or_skip(
        "a_quiet_process_reads_again_when_its_push_connection_comes_back",
    ) else {
        return;
    };
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).await;
    let short = |store| {
        config()
            .count_window(2)
            .minimum_calls(2)
            .open_period(ms(300))
            .fleet(FleetConfig::new(store).refresh_interval(REFRESH))
    };
    let prober = Breaker::with_config("quiet", short(connect(&server.url()).await));
    let quiet = Breaker::with_config("quiet", short(connect(&proxy.url()).await));
    prober.refresh().await.unwrap();
    quiet.refresh().await.unwrap();
    // Both listen before the opening is published (under load the quiet
    // process's subscription could come after it, and it never heard).
    subscribed(&server.url(), 2).await;

    while state(&prober) != State::Open {
        prober.try_acquire().unwrap().record(Outcome::Failure);
    }
    let start = Instant::now();
    while state(&quiet) != State::Open {
        assert!(start.elapsed() < secs(5), "the opening was never pushed");
        sleep(ms(5)).await;
    }

    proxy.go_down();
    sleep(ms(300)).await;
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < secs(5), "the prober never closed");
        if let Ok(permit) = prober.try_acquire() {
            permit.record(Outcome::Success);
        }
        if state(&prober) == State::Closed {
            break;
        }
        sleep(ms(5)).await;
    }
    sleep(ms(200)).await;
    assert_eq!(state(&quiet), State::Open, "it heard nothing yet");

    proxy.come_up();
    let back = Instant::now();
    while state(&quiet) != State::Closed {
        assert!(
            back.elapsed() < secs(5),
            "the quiet process still reads open, without a call: {:?}",
            quiet.snapshot()
        );
        sleep(ms(10)).await;
    }
    println!(
        "quiet process: closed {:?} after its connections came back, without a call",
        back.elapsed()
    );
}
