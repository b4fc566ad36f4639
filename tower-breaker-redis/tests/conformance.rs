//! The store contract (`tower-breaker-conformance`), clause by clause, on
//! one Redis node, a Redis Cluster (feature `cluster`) and a primary
//! behind Sentinel, each started for the clause on free ports of
//! 127.0.0.1.

mod support;

use std::sync::Arc;

use support::redis_server::RedisServer;
use support::redis_topology::{SentinelSet, DATA_PASSWORD, SERVICE};
use tower_breaker_conformance::Fixture;
use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};

async fn node(clause: &'static str) -> Option<Fixture> {
    let server = RedisServer::start_or_skip(clause)?;
    let store = RedisStore::connect(&server.url(), RedisOptions::new().timeout(secs(5)))
        .await
        .expect("connect to redis-server");
    Some(Fixture::with_guard(Arc::new(store), server))
}

async fn sentinel(clause: &'static str) -> Option<Fixture> {
    let set = SentinelSet::start_or_skip(clause, 1)?;
    let target = RedisTarget::sentinel(set.sentinel_urls(), SERVICE)
        .expect("a sentinel target")
        .password(DATA_PASSWORD);
    let store = RedisStore::connect_with(target, RedisOptions::new().timeout(secs(5)))
        .await
        .expect("connect through the sentinels");
    Some(Fixture::with_guard(Arc::new(store), set))
}

fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}

mod on_one_node {
    tower_breaker_conformance::tests!(super::node);
}

mod behind_sentinel {
    tower_breaker_conformance::tests!(super::sentinel);
}

#[cfg(feature = "cluster")]
mod on_a_cluster {
    use super::*;
    use support::redis_topology::Cluster;

    async fn cluster(clause: &'static str) -> Option<Fixture> {
        let cluster = Cluster::start_or_skip(clause)?;
        let target = RedisTarget::cluster(cluster.urls()).expect("a cluster target");
        let store = RedisStore::connect_with(target, RedisOptions::new().timeout(secs(5)))
            .await
            .expect("connect to the cluster");
        Some(Fixture::with_guard(Arc::new(store), cluster))
    }

    tower_breaker_conformance::tests!(cluster);
}
