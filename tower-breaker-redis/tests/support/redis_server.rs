//! A private `redis-server` per test, on a free port of 127.0.0.1, killed
//! on drop, so that tests can kill and restart it (never the system one).

use std::collections::HashMap;
use std::time::Duration;

/// A `redis-server` child process (the workspace's test launcher), with
/// what the Redis tests read behind the store's back.
#[derive(Debug)]
pub struct RedisServer(resilience_testkit::redis::RedisServer);

impl RedisServer {
    /// Starts one, or, when no `redis-server` is on the `PATH`, says so on
    /// the real stderr (not captured by the test harness) and returns
    /// `None` so that the test returns early. With `TOWER_REQUIRE_SERVERS`
    /// set (as `.ci/run` does), a missing server fails the test instead.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        let hint = "install it to run the Redis store tests";
        super::server_found("redis-server", "--version", test, hint).then(Self::start)
    }

    /// Starts one on a free port and waits until it answers.
    pub fn start() -> Self {
        Self(resilience_testkit::redis::RedisServer::start())
    }

    pub fn port(&self) -> u16 {
        self.0.port()
    }

    pub fn url(&self) -> String {
        self.0.url()
    }

    /// Kills it (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts it (again) on the same port, empty, and waits until it
    /// answers.
    pub fn restart(&mut self) {
        self.0.restart();
    }

    fn try_raw(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// A plain blocking connection, to look behind the store's back.
    pub fn raw(&self) -> redis::Connection {
        self.try_raw().expect("connect to the test redis-server")
    }

    /// The calls of each command so far (`INFO commandstats`).
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.raw())
            .unwrap();
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// The breaker record at `key`, field by field.
    pub fn record(&self, key: &str) -> HashMap<String, String> {
        redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.raw())
            .unwrap()
    }

    /// The server's clock, in milliseconds.
    pub fn now_ms(&self) -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut self.raw()).unwrap();
        s * 1000 + us / 1000
    }
}
