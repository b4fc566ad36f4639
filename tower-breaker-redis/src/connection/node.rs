//! The connection to one Redis node: a multiplexed connection, replaced
//! when it breaks, to a fixed address or to the primary that Sentinel
//! names.
//!
//! Connecting happens in a task of its own, so that a caller that gives
//! up (the store's timeout) never cancels it: callers wait for it, and a
//! failed attempt is reported to every waiter with its cause (a refused
//! password, an untrusted certificate, ...), then retried with backoff at
//! the next call.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Dial;

/// The first wait after a failed connection attempt; it doubles with each
/// failure in a row, up to [`MAX_DELAY`].
const MIN_DELAY: Duration = Duration::from_millis(50);
/// The longest wait between two connection attempts.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// At most one check with the sentinels per this interval, when calls go
/// unanswered.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Calls in a row left unanswered on a fixed node's connection (each cut
/// by the store's timeout, which is much shorter than the connection's own
/// response timeout) before the connection is taken for dead and replaced:
/// a partition without FIN or RST, a failover that moved the address to
/// another host, a frozen server. A slow but live server costs one
/// reconnection per this many timeouts.
const SILENT_BEFORE_REPLACE: u32 = 3;

/// A connection to one node, cheap to clone (every clone shares it).
#[derive(Clone)]
pub(super) struct Node {
    shared: Arc<Shared>,
}

/// Where a [`Node`] connects.
pub(super) enum Source {
    /// Always the same address.
    Fixed(Client),
    /// The primary that the sentinels name for a service.
    Sentinel(Sentinel),
}

/// The sentinels watching one primary, and how to reach the primaries
/// they name.
#[derive(Clone)]
pub(super) struct Sentinel {
    pub(super) sentinels: Vec<Client>,
    pub(super) service: String,
    pub(super) primary: Dial,
}

struct Shared {
    source: Source,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    db: i64,
    state: Mutex<State>,
    /// Woken whenever a connection attempt ends.
    changed: Notify,
}

#[derive(Default)]
struct State {
    current: Option<Current>,
    attempt: Attempt,
    /// Failed attempts in a row.
    failures: u32,
    /// Connections made so far: the id of the next one.
    next_id: u64,
    /// A check with the sentinels is running.
    checking: bool,
    last_check: Option<Instant>,
    /// Calls in a row left unanswered on the current connection.
    silent: u32,
}

/// The connection in use.
#[derive(Clone)]
struct Current {
    id: u64,
    conn: MultiplexedConnection,
    /// The address it reached (host, port).
    addr: (String, u16),
}

#[derive(Default)]
enum Attempt {
    /// No attempt is running, and the last one (if any) succeeded.
    #[default]
    Idle,
    /// A task is connecting.
    Running,
    /// The last attempt failed; the next one waits until `retry_at`.
    Failed {
        error: RedisError,
        retry_at: Instant,
    },
}

/// Notices a call that was given up before its reply (the store's
/// timeout dropped it).
struct Watch<'a> {
    node: &'a Node,
    id: u64,
    done: bool,
}

// === impl Node ===

impl Node {
    /// A node connection that connects at its first call.
    pub(super) fn new(source: Source, connect_timeout: Duration, db: i64) -> Self {
        let config = config(connect_timeout);
        Self {
            shared: Arc::new(Shared {
                source,
                config,
                connect_timeout,
                db,
                state: Mutex::new(State::default()),
                changed: Notify::new(),
            }),
        }
    }

    /// The longest a connection attempt takes: the connect timeout, twice
    /// for Sentinel (asking the sentinels, then connecting to the primary).
    pub(super) fn attempt_bound(&self) -> Duration {
        match self.shared.source {
            Source::Fixed(_) => self.shared.connect_timeout,
            Source::Sentinel(_) => self.shared.connect_timeout * 2,
        }
    }

    pub(super) fn is_sentinel(&self) -> bool {
        matches!(self.shared.source, Source::Sentinel(_))
    }

    /// The connection in use, after waiting for a connection attempt if
    /// there is none (starting one unless the last failed too recently).
    async fn current(&self) -> RedisResult<Current> {
        loop {
            // Created before the state is read, so that the end of an
            // attempt between the read and the wait is not missed.
            let changed = self.shared.changed.notified();
            {
                let mut state = self.shared.lock();
                if let Some(current) = &state.current {
                    return Ok(current.clone());
                }
                match &state.attempt {
                    Attempt::Running => {}
                    Attempt::Failed { error, retry_at } if Instant::now() < *retry_at => {
                        return Err(error.clone());
                    }
                    Attempt::Failed { .. } | Attempt::Idle => self.shared.start(&mut state),
                }
            }
            changed.await;
        }
    }

    /// A call on connection `id` failed: replace the connection if the
    /// error says it is unusable (or, through Sentinel, that it no longer
    /// reaches the primary).
    fn failed(&self, id: u64, error: &RedisError) {
        let demoted = self.is_sentinel()
            && matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            );
        if !(demoted || error.is_unrecoverable_error()) {
            return;
        }
        let mut state = self.shared.lock();
        if state.current.as_ref().is_some_and(|c| c.id == id) {
            state.current = None;
            if matches!(state.attempt, Attempt::Idle) {
                self.shared.start(&mut state);
            }
        }
    }

    /// A call on connection `id` was answered: it is alive.
    fn answered(&self, id: u64) {
        let mut state = self.shared.lock();
        if state.silent != 0 && state.current.as_ref().is_some_and(|c| c.id == id) {
            state.silent = 0;
        }
    }

    /// A call on connection `id` went unanswered: through Sentinel, ask
    /// whether the primary has moved (a frozen or unreachable primary
    /// sends no error, only silence).
    fn abandoned(&self, id: u64) {
        if !self.is_sentinel() {
            // A fixed node: after a few silent calls in a row, a new
            // connection (the old one may never answer again, and the
            // kernel may take many minutes to give up on it).
            let mut state = self.shared.lock();
            if state.current.as_ref().is_some_and(|c| c.id == id) {
                state.silent += 1;
                if state.silent >= SILENT_BEFORE_REPLACE {
                    state.current = None;
                    if matches!(state.attempt, Attempt::Idle) {
                        self.shared.start(&mut state);
                    }
                }
            }
            return;
        }
        let mut state = self.shared.lock();
        let now = Instant::now();
        if state.checking || state.last_check.is_some_and(|t| now < t + CHECK_EVERY) {
            return;
        }
        state.last_check = Some(now);
        state.checking = spawn(Shared::check(self.shared.clone(), id));
    }
}

impl ConnectionLike for Node {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut current = self.current().await?;
            let mut watch = Watch::new(self, current.id);
            let result = current.conn.send_packed_command(cmd).await;
            watch.finish(result.as_ref().err());
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut current = self.current().await?;
            let mut watch = Watch::new(self, current.id);
            let result = current.conn.send_packed_commands(cmd, offset, count).await;
            watch.finish(result.as_ref().err());
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No address: the client's connection info holds the password.
        let state = self.shared.lock();
        let connected = state.current.is_some();
        drop(state);
        f.debug_struct("Node")
            .field("sentinel", &self.is_sentinel())
            .field("connected", &connected)
            .finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step, so a panic elsewhere
        // while it was held does not spoil it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a connection attempt in a task of its own (outside a tokio
    /// runtime there is none: the attempt fails at once, so that nobody
    /// waits for it).
    fn start(self: &Arc<Self>, state: &mut State) {
        if spawn(Self::attempt(self.clone())) {
            state.attempt = Attempt::Running;
        } else {
            state.attempt = Attempt::Failed {
                error: RedisError::from((
                    ErrorKind::Client,
                    "the redis circuit store connects from a tokio runtime",
                )),
                retry_at: Instant::now(),
            };
        }
    }

    async fn attempt(self: Arc<Self>) {
        let bound = match self.source {
            Source::Fixed(_) => self.connect_timeout,
            Source::Sentinel(_) => self.connect_timeout * 2,
        };
        let result = match tokio::time::timeout(bound, self.connect()).await {
            Ok(result) => result,
            Err(_) => Err(no_answer("redis", bound)),
        };
        {
            let mut state = self.lock();
            match result {
                Ok((conn, addr)) => {
                    state.next_id += 1;
                    state.current = Some(Current {
                        id: state.next_id,
                        conn,
                        addr,
                    });
                    state.attempt = Attempt::Idle;
                    state.failures = 0;
                    state.silent = 0;
                }
                Err(error) => {
                    state.failures = state.failures.saturating_add(1);
                    state.attempt = Attempt::Failed {
                        error,
                        retry_at: Instant::now() + backoff(state.failures),
                    };
                }
            }
        }
        self.changed.notify_waiters();
    }

    async fn connect(&self) -> RedisResult<(MultiplexedConnection, (String, u16))> {
        match &self.source {
            Source::Fixed(client) => {
                let conn = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                Ok((conn, (String::new(), 0)))
            }
            Source::Sentinel(sentinel) => {
                let (host, port) = sentinel
                    .primary_addr(&self.config, self.connect_timeout)
                    .await?;
                let client = sentinel.primary.client(host.clone(), port)?;
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                // Sentinel may name a node that has not finished its
                // promotion (or was demoted since): only a node that says
                // it is the primary will do.
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
                match role.first() {
                    Some(Value::BulkString(role)) if role == b"master" => Ok((conn, (host, port))),
                    _ => Err(RedisError::from((
                        ErrorKind::Client,
                        "the node named by sentinel is not a primary (yet)",
                        format!("{host}:{port}"),
                    ))),
                }
            }
        }
    }

    /// Asks the sentinels where the primary is; if it is no longer where
    /// connection `id` goes, replaces the connection.
    async fn check(self: Arc<Self>, id: u64) {
        let Source::Sentinel(sentinel) = &self.source else {
            return;
        };
        let addr = sentinel
            .primary_addr(&self.config, self.connect_timeout)
            .await;
        let mut state = self.lock();
        state.checking = false;
        let moved = match (&addr, &state.current) {
            (Ok(addr), Some(current)) => current.id == id && current.addr != *addr,
            _ => false,
        };
        if moved {
            state.current = None;
            if matches!(state.attempt, Attempt::Idle) {
                self.start(&mut state);
            }
        }
    }
}

// === impl Sentinel ===

impl Sentinel {
    /// Asks every sentinel at once for the primary's address; the first
    /// answer wins. Each question is bounded by `bound`.
    pub(super) async fn primary_addr(
        &self,
        config: &AsyncConnectionConfig,
        bound: Duration,
    ) -> RedisResult<(String, u16)> {
        let mut asks = JoinSet::new();
        for client in &self.sentinels {
            let client = client.clone();
            let service = self.service.clone();
            let config = config.clone();
            asks.spawn(async move {
                let ask = async {
                    let mut conn = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(&service)
                        .query_async::<Option<(String, u16)>>(&mut conn)
                        .await
                };
                tokio::time::timeout(bound, ask)
                    .await
                    .unwrap_or_else(|_| Err(no_answer("sentinel", bound)))
            });
        }
        let mut last = None;
        while let Some(answer) = asks.join_next().await {
            match answer {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => {
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "a sentinel does not know the service",
                        self.service.clone(),
                    )));
                }
                Ok(Err(e)) => last = Some(e),
                Err(e) => last = Some(io::Error::other(e).into()),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::EmptySentinelList, "no sentinel to ask"))
        }))
    }
}

// === impl Watch ===

impl<'a> Watch<'a> {
    fn new(node: &'a Node, id: u64) -> Self {
        Self {
            node,
            id,
            done: false,
        }
    }

    fn finish(&mut self, error: Option<&RedisError>) {
        self.done = true;
        match error {
            Some(error) => self.node.failed(self.id, error),
            None => self.node.answered(self.id),
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.node.abandoned(self.id);
        }
    }
}

/// The settings of every connection: connecting, and each reply, bounded
/// by the connect timeout (the store bounds each call more tightly).
pub(super) fn config(connect_timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(connect_timeout))
}

/// Spawns on the current runtime; false outside one (a call polled by
/// another executor, or dropped while the runtime shuts down).
fn spawn<F>(task: F) -> bool
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            drop(handle.spawn(task));
            true
        }
        Err(_) => false,
    }
}

/// 50 ms after the first failure in a row, doubling up to 1 s.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(10);
    (MIN_DELAY * 2u32.pow(doublings)).min(MAX_DELAY)
}

pub(super) fn no_answer(what: &str, bound: Duration) -> RedisError {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no answer from {what} within {bound:?}"),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_second() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(5), Duration::from_millis(800));
        assert_eq!(backoff(6), MAX_DELAY);
        assert_eq!(backoff(u32::MAX), MAX_DELAY);
    }
}
