//! How the store reaches Redis: the connection every script runs on, and
//! the ways to build a store from a URL.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::{RedisOptions, RedisStore};
use crate::BoxError;

/// The connection of a [`RedisStore`]: cheap to clone (each clone shares
/// one multiplexed connection), reconnecting by itself.
#[derive(Clone)]
pub(super) struct Connection {
    inner: ConnectionManager,
}

// === impl Connection ===

impl From<ConnectionManager> for Connection {
    fn from(inner: ConnectionManager) -> Self {
        Self { inner }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`, or
    /// `rediss://` with a TLS feature of the `redis` crate, see the
    /// [module docs](self#tls)) and checks that it answers within the
    /// connect timeout.
    ///
    /// The connection reconnects by itself after errors, with backoff
    /// (50 ms doubling to 1 s, then again at the next call), so a store
    /// that was reachable once keeps working across Redis restarts.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the URL or the options are refused, or the
    /// server does not answer a `PING` within the connect timeout. To
    /// start while Redis is down (failing open until it is up), use
    /// [`connect_lazy`](RedisStore::connect_lazy).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, ConnectError> {
        let store = Self::connect_lazy(url, options)?;
        let mut conn = store.conn.clone();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut conn);
        match tokio::time::timeout(store.options.connect_timeout, ping).await {
            Ok(Ok(_)) => Ok(store),
            Ok(Err(e)) => Err(ConnectError::new(e)),
            Err(_) => Err(ConnectError::new(format!(
                "no answer within {:?}",
                store.options.connect_timeout
            ))),
        }
    }

    /// Like [`connect`](RedisStore::connect), but does not connect before
    /// the first store call: the process starts even while Redis is down,
    /// and its breakers fail open (or closed) until it is up.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the URL or the options are refused.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the connection spawns a task).
    pub fn connect_lazy(url: &str, options: RedisOptions) -> Result<Self, ConnectError> {
        options.check().map_err(ConnectError::new)?;
        let client = redis::Client::open(url).map_err(ConnectError::new)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(5);
        let manager =
            ConnectionManager::new_lazy_with_config(client, config).map_err(ConnectError::new)?;
        Ok(Self::with_connection(Connection::from(manager), options))
    }
}

/// [`RedisStore::connect`] could not parse the URL, check the options or
/// reach the server in time.
///
/// # Example
///
/// ```
/// use tower_breaker::redis_store::{ConnectError, RedisOptions, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err: ConnectError = RedisStore::connect_lazy("nonsense://x", RedisOptions::new()).unwrap_err();
/// assert!(err.to_string().starts_with("could not connect to the redis circuit store"));
/// assert!(std::error::Error::source(&err).is_some());
/// # }
/// ```
#[derive(Debug)]
pub struct ConnectError {
    source: BoxError,
}

// === impl ConnectError ===

impl ConnectError {
    fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not connect to the redis circuit store: {}",
            self.source
        )
    }
}

impl Error for ConnectError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source as &(dyn Error + 'static))
    }
}
