//! [`RedisStore`]: the shared decision of a fleet's breakers in Redis, a
//! [`Store`] for [`tower_breaker`].
//!
//! One Redis hash per breaker name, at key `prefix + name` (default prefix
//! [`DEFAULT_PREFIX`]; the name percent-encoded, see [`RedisStore::key`]),
//! holds "open until T" and what the election needs:
//!
//! | field | what |
//! |---|---|
//! | `state` | `open`, or `closed` once a prober closed the circuit |
//! | `until` | T, in milliseconds of the Redis server's clock |
//! | `token` | the token of the last writer (an opener, the elected prober) |
//! | `reopens` | failed probes in a row since the circuit last closed |
//! | `period` | the length of the current opening, in milliseconds |
//! | `since` | when the current opening started (or the circuit closed), server time |
//! | `lease` | until when the elected prober may probe, server time (0: no prober) |
//!
//! Every decision is one Lua script, run atomically by the server and
//! reading the server's clock (`TIME`), so the clocks of the processes
//! never matter and no two processes can interleave. The scripts are
//! files of their own (`src/lua/*.lua`, each opening with a
//! comment block: its keys, arguments, what it reads, writes and returns),
//! loaded after a shared prelude of helpers:
//!
//! - **open** ([`Store::try_open`]): if the circuit is not open, or its T
//!   has passed (or is unreadable), write T = now + the period; otherwise
//!   keep the existing T. Either way return the time left until the
//!   effective T. Concurrent openers never push T forward: the first one
//!   wins, the others adopt its T.
//! - **elect** ([`Store::try_acquire_probe`]): closed: closed. An elected
//!   prober's lease still running: lost to it ([`Election::Probing`], with
//!   the time left of T and of the lease). T in the future: lost, with the
//!   time left. T passed and no lease (or no record at all: a record lost
//!   while processes knew the circuit open): this caller wins; T moves
//!   forward by the longer of the caller's period and the last opening's,
//!   it holds a short lease ([`probe_lease`](tower_breaker::FleetConfig::probe_lease),
//!   2 s), a fresh token is stored, the fleet's window starts empty, and
//!   the winner learns the count of re-opens so far.
//! - **renew** ([`Store::renew_probe`]): while its probe runs, the winner
//!   extends its lease every third of it, if the record still holds its
//!   token. So a slow live prober is never joined by a second one, and a
//!   prober that dies or freezes holds the fleet back one lease past T.
//! - **release** ([`Store::release_probe`]): the winner had no call to
//!   probe with: if the record still holds its token, T is now and the
//!   lease ends (the count of re-opens is kept), so the next candidate wins
//!   at once.
//! - **close** ([`Store::close`]): mark the circuit closed (with an empty
//!   window) only if the record still holds the winner's token. The mark
//!   stays for the
//!   cleanup time, so that a record that *vanished* (a restart without
//!   persistence, a failover to a replica that had not received it, an
//!   eviction) is never mistaken for a fleet that closed.
//! - **reopen** ([`Store::reopen`]): the winner's probe failed. If the
//!   record still holds its token, T = now + the period the breaker grew
//!   from that count (never earlier than the election's T), the lease ends
//!   and the count goes up by one; otherwise nothing is written (a stale
//!   prober cannot re-create a circuit the fleet has closed since).
//! - **read** ([`Store::read`]): closed (the mark), open with the time left
//!   (while an elected prober's lease runs, [`Decision::Probing`], with the
//!   time left of the lease too: callers refused meanwhile are told to come
//!   back when the probe should have ended, not at T), expired (T passed: an election is due), or missing (no record: never
//!   opened, or lost; a process that knows the circuit open keeps its
//!   opening and writes it again). A record whose T is unreadable is an
//!   error, so the alarm fires; the next **open** or election repairs it.
//!
//! The key's time to live is set, on every write, to some time
//! ([`RedisOptions::cleanup_after`]) after T (or after the close). It is
//! cleanup only: the state is decided by the `state` mark and by comparing
//! T with the server's clock, never by whether the key exists.
//!
//! Every call is bounded by [`RedisOptions::timeout`] (default 50 ms); a
//! timeout, a connection error or a reply the store cannot read is a
//! [`StoreError`], and the breaker fails open (or closed, as configured:
//! [`StoreFailureMode`](tower_breaker::store::StoreFailureMode)). The connection
//! reconnects by itself, so sharing resumes when Redis comes back; scripts
//! are sent again if a restarted server has forgotten them.
//!
//! # Where Redis is, how to log in, TLS
//!
//! [`RedisTarget`] says how to reach Redis: one node (or a managed
//! primary endpoint, [`RedisTarget::node`]), a primary watched by Sentinel
//! ([`RedisTarget::sentinel`], followed through failovers), or a cluster
//! ([`RedisTarget::cluster`], feature `cluster`; every script touches
//! one key, so any slot layout works). [`RedisTarget::user`] logs in as an
//! ACL user; with the feature `tls` (rustls with the `ring` crypto
//! provider: no system OpenSSL), `rediss://` targets trust the system roots
//! or only the CA given to `RedisTarget::tls_ca_pem`. Build the store with
//! [`RedisStore::connect_with`]. Neither the target's `Debug` nor any error
//! or event shows a password. A least-privilege ACL for the store:
//! `~tower-breaker:* &tower-breaker:* +@read +@write +@scripting +@pubsub
//! +ping +time -@dangerous` (and `+role` through Sentinel), with your own
//! prefix in place of `tower-breaker:`.
//!
//! # Pushes
//!
//! The scripts publish every opening and close on the circuit's key, and a
//! store built from a target subscribes (one pub/sub connection per store,
//! reconnecting by itself), so every breaker of the fleet learns of an
//! opening within milliseconds. Messages published while the subscriber
//! was disconnected (a restart of Redis, a partition) are lost: when it
//! connects again, every breaker of the store reads its circuit's decision
//! again, so a quiet process (one that makes no calls, hence no periodic
//! reads) does not keep reading "open" after the fleet closed. A record
//! lost in a restart is never taken for a close: a process that knows of
//! an opening writes it again.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower_breaker_redis::{RedisOptions, RedisStore};
//! use tower_breaker::{Breaker, BreakerConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), tower_breaker::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::new()).await?;
//! let config = BreakerConfig::new().store(Arc::new(store));
//! let breaker = Breaker::try_with_config("payments", config)?;
//! breaker.refresh().await?; // learn the fleet's circuit before serving
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::error::Error;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::Script;

mod connection;
mod push;

use connection::Connection;
pub use connection::{ConnectError, RedisTarget};

use push::Push;
/// The `redis` crate this store is built on (the 1.x line), for the
/// `redis::aio::ConnectionManager` that [`RedisStore::new`] takes: build it
/// with this re-export and its version always matches the store's, whatever
/// `redis` your own `Cargo.toml` names. A new major of `redis` is a new
/// major of this crate.
///
/// # Example
///
/// ```no_run
/// use tower_breaker_redis::{redis, RedisOptions, RedisStore};
///
/// # async fn run() -> Result<(), tower_breaker::BoxError> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let manager = redis::aio::ConnectionManager::new(client).await?;
/// let store = RedisStore::new(manager, RedisOptions::new())?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
pub use redis;
use tower_breaker::store::{
    bounded_name, BudgetRule, Decision, Election, FleetRule, ProbeToken, Report, Store, StoreError,
    StoreFuture, Tokens, Watcher,
};

/// The default key prefix: `"tower-breaker:"`.
pub const DEFAULT_PREFIX: &str = "tower-breaker:";
/// The default bound of one store call: 50 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default bound of connecting (and of each reconnection attempt): 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default time a record is kept after its T: 10 minutes (the same as
/// [`MemoryStore`](tower_breaker::store::MemoryStore)'s).
pub const DEFAULT_CLEANUP_AFTER: Duration = tower_breaker::store::DEFAULT_CLEANUP_AFTER;
/// The longest breaker name kept as it is: 200 bytes. A longer one is
/// kept as its first bytes and a hash of the whole
/// ([`bounded_name`]), never refused.
pub const MAX_NAME_LEN: usize = 200;
/// The longest key prefix: 64 bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// Shared by every script: the server's clock in milliseconds, and the
/// write of a whole open record with its cleanup time.
const PRELUDE: &str = include_str!("lua/prelude.lua");

/// ARGV: period, token, cleanup. Returns {wrote, remaining}.
const OPEN: &str = include_str!("lua/open.lua");

/// ARGV: calls, failures, slow, bucket ms, buckets, minimum calls, failure
/// ppm, slow ppm (0: off), period, token, cleanup, count window (0: the
/// buckets), tail, tail span ms. Returns what **read**
/// returns, after adding the report to the fleet's window and opening if
/// the window breaks the rule.
const REPORT: &str = include_str!("lua/report.lua");

/// ARGV: period, token, lease, cleanup. Returns {0} closed, {1, remaining}
/// lost, {2, reopens, period} won.
const ELECT: &str = include_str!("lua/elect.lua");

/// ARGV: period, the winner's token, a fresh token, cleanup. Returns
/// {wrote, remaining}.
const REOPEN: &str = include_str!("lua/reopen.lua");

/// ARGV: token, cleanup. Returns {1} if it closed the circuit.
const CLOSE: &str = include_str!("lua/close.lua");

/// ARGV: lease, the winner's token, cleanup. Returns {1} renewed, {0}
/// fenced.
const RENEW: &str = include_str!("lua/renew.lua");

/// ARGV: the winner's token, cleanup. Returns {1} given back, {0} fenced.
const RELEASE: &str = include_str!("lua/release.lua");

/// Returns {0} closed, {1, remaining} open, {2} expired, {3} missing.
const READ: &str = include_str!("lua/read.lua");
/// Claims a retry of the fleet's budget (see the script's header).
const CLAIM: &str = include_str!("lua/claim.lua");

/// A [`Store`] in Redis: the breakers of every process that uses the same
/// Redis, prefix and breaker name share one circuit.
///
/// See the [module docs](self) for the record and the scripts, and the
/// [crate docs](tower_breaker#shared-state-redis) for the trade-offs.
///
/// # Clone
///
/// Not `Clone`; share it as `Arc<RedisStore>` (what
/// [`BreakerConfig::store`](tower_breaker::BreakerConfig::store) takes). Its
/// connection is multiplexed, used by every breaker of the process.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_breaker_redis::{RedisOptions, RedisStore};
/// use tower_breaker::store::{Decision, Store};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), tower_breaker::BoxError> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let manager = redis::aio::ConnectionManager::new(client).await?;
/// let store = RedisStore::new(
///     manager,
///     RedisOptions::new().prefix("shop:breakers:").timeout(Duration::from_millis(20)),
/// )?;
/// assert_eq!(store.key("payments")?, "shop:breakers:payments");
///
/// store.try_open("payments", Duration::from_secs(5)).await?;
/// assert!(matches!(store.read("payments").await?, Decision::Open { .. }));
/// # Ok(())
/// # }
/// ```
pub struct RedisStore {
    conn: Connection,
    options: RedisOptions,
    scripts: Scripts,
    tokens: Tokens,
    /// The subscriber of pushed decisions, when the store knows how to
    /// open a pub/sub connection.
    push: Option<Arc<Push>>,
}

/// The settings of a [`RedisStore`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker_redis::RedisOptions;
///
/// let options = RedisOptions::new()
///     .prefix("checkout:")
///     .timeout(Duration::from_millis(25))
///     .cleanup_after(Duration::from_secs(3600));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisOptions {
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    cleanup_after: Duration,
}

/// A breaker name or key prefix the store refuses.
///
/// A breaker name may be any non-empty text (longer than [`MAX_NAME_LEN`]
/// bytes, it is kept in a bounded form): it is percent-encoded into the
/// key (see [`RedisStore::key`]), so route
/// templates (`/users/{id}`), IPv6 hosts (`[::1]:8080`) and any Unicode
/// share their circuits like any other name. A prefix is written as it is:
/// it may hold ASCII letters and digits and `- _ . : / @ + = ~ ,`, at most
/// [`MAX_PREFIX_LEN`] bytes. So every key is safe to type, scan and log,
/// and holds no `{}` (Redis Cluster hash tags).
///
/// # Example
///
/// ```
/// use tower_breaker_redis::{InvalidName, RedisOptions};
///
/// let err: InvalidName = RedisOptions::new().prefix("a b").check().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "invalid key prefix \"a b\" for the redis circuit store: ' ' is not allowed"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName {
    what: &'static str,
    name: String,
    reason: String,
}

#[derive(Debug)]
struct Scripts {
    open: Script,
    elect: Script,
    reopen: Script,
    close: Script,
    renew: Script,
    release: Script,
    read: Script,
    report: Script,
    claim: Script,
}

// === impl RedisOptions ===

impl RedisOptions {
    /// Every default: prefix [`DEFAULT_PREFIX`], timeout
    /// [`DEFAULT_TIMEOUT`], connect timeout [`DEFAULT_CONNECT_TIMEOUT`],
    /// cleanup after [`DEFAULT_CLEANUP_AFTER`].
    pub fn new() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            cleanup_after: DEFAULT_CLEANUP_AFTER,
        }
    }

    /// The prefix of every key (default [`DEFAULT_PREFIX`]): the key of a
    /// breaker is the prefix followed by its name. Give each environment
    /// (or each application sharing a Redis) its own. Checked when the
    /// store is built (see [`InvalidName`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest wait for one store call (default 50 ms; at least 1 ms).
    /// Past it the call fails and the breaker keeps its local decision.
    /// Keep it well below the latency your callers can afford: store calls
    /// never delay a call that is admitted, but an election waits for it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest wait for connecting, in [`RedisStore::connect`] and in
    /// each reconnection attempt of the connection it builds (default 1 s;
    /// at least 1 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a record is kept after its T (default 10 minutes): the
    /// key's time to live, renewed on every write. Cleanup only; a
    /// record whose T has passed is expired whether or not it still exists.
    /// While it exists it keeps the count of re-opens, so the open period
    /// keeps growing across quiet spells shorter than this.
    pub fn cleanup_after(mut self, after: Duration) -> Self {
        self.cleanup_after = after;
        self
    }

    /// Checks the prefix.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] if the prefix is too long, holds a character that
    /// is not allowed, or does not end with `:` (an empty prefix is
    /// allowed). With the `:`, and names whose `:` are written `%3A`, no
    /// two (prefix, name) pairs share a key: `a:` + `b` is `a:b`, `a:` +
    /// `:b` is `a:%3Ab`, and `a` is refused.
    pub fn check(&self) -> Result<(), InvalidName> {
        check(&self.prefix, "key prefix", 0, MAX_PREFIX_LEN)?;
        if !self.prefix.is_empty() && !self.prefix.ends_with(':') {
            return Err(InvalidName {
                what: "key prefix",
                name: self.prefix.clone(),
                reason: String::from(
                    "it must end with ':', so that no other prefix's keys are also its own",
                ),
            });
        }
        Ok(())
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self::new()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// A store on a connection you built (with your own reconnection and
    /// TLS settings).
    ///
    /// # Errors
    ///
    /// [`InvalidName`] if the options' prefix is refused.
    pub fn new(manager: ConnectionManager, options: RedisOptions) -> Result<Self, InvalidName> {
        options.check()?;
        Ok(Self::with_connection(Connection::from(manager), options))
    }

    /// A store on `conn`, with options already checked.
    fn with_connection(conn: Connection, options: RedisOptions) -> Self {
        Self {
            conn,
            options,
            scripts: Scripts {
                open: script(OPEN),
                elect: script(ELECT),
                reopen: script(REOPEN),
                close: script(CLOSE),
                renew: script(RENEW),
                release: script(RELEASE),
                read: script(READ),
                report: script(REPORT),
                claim: script(CLAIM),
            },
            tokens: Tokens::new(),
            push: None,
        }
    }

    /// This store with pushes: `dial` opens the pub/sub connection its
    /// subscriber listens on.
    fn with_push(mut self, dial: push::Dial) -> Self {
        self.push = Some(Arc::new(Push::new(dial)));
        self
    }

    /// The Redis key of the breaker named `name`: the prefix followed by
    /// the name, percent-encoded: ASCII letters, digits and
    /// `- _ . / @ + = ~ ,` stay as they are, every other byte (of the
    /// name's UTF-8, `:` included) becomes `%XX`. Distinct names give
    /// distinct keys, the prefix's last `:` is the only one after the
    /// prefix (so no two prefixes' keys meet), and no key holds a space, a
    /// glob character or a Redis Cluster hash tag.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] if the name is empty. A name longer than
    /// [`MAX_NAME_LEN`] bytes is kept as
    /// [`bounded_name`] makes it.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_breaker::BoxError> {
    /// use tower_breaker_redis::{RedisOptions, RedisStore};
    ///
    /// let store = RedisStore::connect_lazy("redis://127.0.0.1:6379", RedisOptions::new())?;
    /// assert_eq!(store.key("routes/users/{id}")?, "tower-breaker:routes/users/%7Bid%7D");
    /// assert_eq!(store.key("[::1]:8080")?, "tower-breaker:%5B%3A%3A1%5D%3A8080");
    /// # Ok(())
    /// # }
    /// ```
    pub fn key(&self, name: &str) -> Result<String, InvalidName> {
        let refuse = |reason: String| InvalidName {
            what: "breaker name",
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(refuse("it is empty".to_owned()));
        }
        // A longer name is kept in a bounded form: its first bytes and a
        // hash of the whole, the same in every process.
        let name = bounded_name(name, MAX_NAME_LEN);
        let mut key = String::with_capacity(self.options.prefix.len() + name.len());
        key.push_str(&self.options.prefix);
        for byte in name.bytes() {
            let c = char::from(byte);
            // A `:` of a name is encoded: the prefix's last `:` is the only
            // one between the prefix and the name (see `RedisOptions::check`).
            if byte.is_ascii() && allowed(c) && c != ':' {
                key.push(c);
            } else {
                key.push('%');
                key.push(char::from(HEX[usize::from(byte >> 4)]));
                key.push(char::from(HEX[usize::from(byte & 0xF)]));
            }
        }
        Ok(key)
    }

    /// The options the store was built with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// A token no other call of any process is likely to draw.
    fn token(&self) -> u64 {
        self.tokens.draw()
    }

    fn store_key(&self, name: &str) -> Result<String, StoreError> {
        self.key(name)
            .map_err(|e| StoreError::with_source("invalid breaker name", e))
    }

    /// Runs `script` on `key`, bounded by the timeout.
    async fn run(&self, script: &Script, key: &str, args: &[u64]) -> Result<Vec<i64>, StoreError> {
        let mut invocation = script.prepare_invoke();
        invocation.key(key);
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.conn.clone();
        let call = invocation.invoke_async::<Vec<i64>>(&mut conn);
        match tower_breaker::store::within(self.options.timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                let not_applied = never_ran(&e);
                let error = StoreError::with_source("redis call failed", e);
                Err(if not_applied {
                    error.not_applied()
                } else {
                    error
                })
            }
            Err(elapsed) => Err(StoreError::with_source(
                format!("no answer from redis within {:?}", self.options.timeout),
                elapsed,
            )),
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.conn)
            .field("options", &self.options)
            .finish()
    }
}

impl Store for RedisStore {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [
                millis(open_for),
                self.token(),
                millis(self.options.cleanup_after),
            ];
            match self.run(&self.scripts.open, &key, &args).await?[..] {
                [_, remaining] => Ok(remaining_ms(remaining)),
                ref other => Err(unexpected("open", other)),
            }
        })
    }

    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let token = self.token();
            let args = [
                millis(open_for),
                token,
                millis(lease),
                millis(self.options.cleanup_after),
            ];
            match self.run(&self.scripts.elect, &key, &args).await?[..] {
                [0] => Ok(Election::Closed),
                [1, remaining] => Ok(Election::Lost {
                    remaining: remaining_ms(remaining),
                }),
                [4, remaining, lease] => Ok(Election::Probing {
                    remaining: remaining_ms(remaining),
                    lease: remaining_ms(lease),
                }),
                [2, reopens, _] => Ok(Election::Won(
                    ProbeToken::new(token)
                        .with_reopens(u32::try_from(reopens.max(0)).unwrap_or(u32::MAX)),
                )),
                ref other => Err(unexpected("elect", other)),
            }
        })
    }

    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [token.get(), millis(self.options.cleanup_after)];
            match self.run(&self.scripts.close, &key, &args).await?[..] {
                [closed] => Ok(closed == 1),
                ref other => Err(unexpected("close", other)),
            }
        })
    }

    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [
                millis(lease),
                token.get(),
                millis(self.options.cleanup_after),
            ];
            match self.run(&self.scripts.renew, &key, &args).await?[..] {
                [renewed] => Ok((renewed == 1).then_some(token)),
                ref other => Err(unexpected("renew", other)),
            }
        })
    }

    fn renews_leases(&self) -> bool {
        true
    }

    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [token.get(), millis(self.options.cleanup_after)];
            match self.run(&self.scripts.release, &key, &args).await?[..] {
                [released] => Ok(released == 1),
                ref other => Err(unexpected("release", other)),
            }
        })
    }

    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            decision(&self.run(&self.scripts.read, &key, &[]).await?, "read")
        })
    }

    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [
                millis(open_for),
                token.get(),
                self.token(),
                millis(self.options.cleanup_after),
            ];
            match self.run(&self.scripts.reopen, &key, &args).await?[..] {
                [_, remaining] => Ok(remaining_ms(remaining)),
                ref other => Err(unexpected("reopen", other)),
            }
        })
    }

    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [
                report.calls,
                report.failures,
                report.slow,
                millis(rule.bucket).max(1),
                u64::from(rule.buckets.max(1)),
                rule.minimum_calls,
                rule.failure_rate_ppm,
                rule.slow_rate_ppm,
                millis(rule.open_for),
                self.token(),
                millis(self.options.cleanup_after),
                rule.count_window,
                report.tail,
                millis(report.tail_span),
                report.credit,
                report.returned,
                rule.budget.map_or(0, |b| b.window_ms()),
            ];
            decision(
                &self.run(&self.scripts.report, &key, &args).await?,
                "report",
            )
        })
    }

    fn claim_retry<'a>(&'a self, name: &'a str, rule: BudgetRule) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let key = self.store_key(name)?;
            let args = [rule.window_ms(), rule.floor];
            match self.run(&self.scripts.claim, &key, &args).await?.as_slice() {
                [1] => Ok(true),
                [0] => Ok(false),
                other => Err(unexpected("claim", other)),
            }
        })
    }

    fn watch(&self, name: &str, watcher: Weak<dyn Watcher>) {
        if let (Some(push), Ok(key)) = (&self.push, self.key(name)) {
            push.watch(key, watcher);
        }
    }

    fn check_name(&self, name: &str) -> Result<(), StoreError> {
        self.store_key(name).map(drop)
    }
}

// === impl InvalidName ===

impl InvalidName {
    /// The refused name or prefix.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} {:?} for the redis circuit store: {}",
            self.what, self.name, self.reason
        )
    }
}

impl Error for InvalidName {}

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Whether a failed call certainly did not run its script: the
/// connection was refused, or the server refused the command before
/// running it (permissions, memory, a read-only replica, a node loading or
/// busy, a cluster that cannot serve). A timeout or a connection lost
/// mid-call may have run it.
fn never_ran(error: &redis::RedisError) -> bool {
    const REFUSED_BEFORE_RUNNING: [&str; 10] = [
        "NOPERM",
        "NOAUTH",
        "WRONGPASS",
        "OOM",
        "READONLY",
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "CLUSTERDOWN",
        "TRYAGAIN",
    ];
    error.is_connection_refusal()
        || error
            .code()
            .is_some_and(|code| REFUSED_BEFORE_RUNNING.contains(&code))
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.:/@+=~,".contains(c)
}

fn check(name: &str, what: &'static str, min: usize, max: usize) -> Result<(), InvalidName> {
    let refuse = |reason: String| InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    if name.len() < min {
        return Err(refuse("it is empty".to_owned()));
    }
    if name.len() > max {
        return Err(refuse(format!("it is longer than {max} bytes")));
    }
    match name.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(refuse(format!("{c:?} is not allowed"))),
        None => Ok(()),
    }
}

/// The decision a **read** (or **report**) script returned.
fn decision(reply: &[i64], script: &str) -> Result<Decision, StoreError> {
    match *reply {
        [0] => Ok(Decision::Closed),
        [1, remaining] => Ok(Decision::Open {
            remaining: remaining_ms(remaining),
        }),
        [2] => Ok(Decision::Expired),
        [3] => Ok(Decision::Missing),
        [4, remaining, lease] => Ok(Decision::Probing {
            remaining: remaining_ms(remaining),
            lease: remaining_ms(lease),
        }),
        ref other => Err(unexpected(script, other)),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4)
}

fn remaining_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn unexpected(script: &str, reply: &[i64]) -> StoreError {
    StoreError::new(format!(
        "unexpected reply {reply:?} from the {script} script"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_never_ran_are_not_applied() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(never_ran(&refused));
        let reset =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(
            !never_ran(&reset),
            "the script may have run before the reset"
        );
        let timed_out = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!never_ran(&timed_out));
    }

    #[tokio::test]
    async fn no_two_prefix_and_name_pairs_share_a_key() {
        let store = |prefix: &str| {
            RedisStore::connect_lazy("redis://127.0.0.1:1", RedisOptions::new().prefix(prefix))
        };
        assert!(store("a").is_err(), "a prefix ends with ':'");
        assert!(store("").is_ok() && store("a:b:").is_ok());
        let (a, ab) = (store("a:").unwrap(), store("a:b:").unwrap());
        assert_eq!(a.key(":b").unwrap(), "a:%3Ab");
        assert_ne!(a.key(":b").unwrap(), a.key("b").unwrap());
        assert_ne!(a.key("b:c").unwrap(), ab.key("c").unwrap());
        assert_eq!(ab.key("c").unwrap(), "a:b:c");
    }

    #[test]
    fn names_are_checked() {
        assert!(check("payments", "breaker name", 1, MAX_NAME_LEN).is_ok());
        assert!(check(
            "hosts:api.example.com:443/v1",
            "breaker name",
            1,
            MAX_NAME_LEN
        )
        .is_ok());
        assert!(check("", "breaker name", 1, MAX_NAME_LEN).is_err());
        assert!(check(&"a".repeat(201), "breaker name", 1, MAX_NAME_LEN).is_err());
        assert!(check(&"a".repeat(200), "breaker name", 1, MAX_NAME_LEN).is_ok());
        for bad in ["a b", "a\nb", "a*", "{tag}", "é", "a?b", "[x]"] {
            assert!(
                check(bad, "breaker name", 1, MAX_NAME_LEN).is_err(),
                "{bad}"
            );
        }
        assert!(check("", "key prefix", 0, MAX_PREFIX_LEN).is_ok());
    }

    /// The scripts as the store builds them, with their bodies.
    const SCRIPTS: [(&str, &str); 8] = [
        ("open", OPEN),
        ("elect", ELECT),
        ("reopen", REOPEN),
        ("close", CLOSE),
        ("renew", RENEW),
        ("release", RELEASE),
        ("read", READ),
        ("report", REPORT),
    ];

    /// Lua's global functions the bodies may call without a definition.
    const LUA_GLOBALS: [&str; 4] = ["tonumber", "tostring", "ipairs", "pairs"];

    /// `code` without its comments (`--` to the end of the line; the
    /// scripts have no `--` inside strings).
    fn code_only(code: &str) -> String {
        code.lines()
            .map(|line| line.find("--").map_or(line, |at| &line[..at]))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The names of the local functions `code` defines.
    fn defined(code: &str) -> Vec<&str> {
        code.match_indices("local function ")
            .map(|(at, m)| {
                let rest = &code[at + m.len()..];
                &rest[..rest.find('(').expect("a parameter list")]
            })
            .collect()
    }

    /// The names of the free functions `code` calls: an identifier right
    /// before `(`, not a field or method (`redis.call(`, `t:sub(`).
    fn called(code: &str) -> Vec<&str> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut names = Vec::new();
        for (at, _) in code.match_indices('(') {
            let before = &code[..at];
            let start = before
                .char_indices()
                .rev()
                .take_while(|(_, c)| ident(*c))
                .last()
                .map_or(at, |(i, _)| i);
            let name = &code[start..at];
            let qualified = before[..start].ends_with(['.', ':']);
            if !name.is_empty() && !qualified {
                names.push(name);
            }
        }
        names
    }

    #[test]
    fn every_script_is_built_with_the_prelude_once_and_calls_only_its_helpers() {
        let prelude = code_only(PRELUDE);
        let helpers = defined(&prelude);
        assert_eq!(
            helpers,
            ["now_ms", "int", "clear_window", "left", "probing", "write"]
        );
        let mut hashes = std::collections::HashSet::new();
        for (name, body) in SCRIPTS {
            // `script` is what the store loads: exactly the prelude, once,
            // then the body (not the body alone, not the prelude twice).
            let built = script(body).get_hash().to_owned();
            assert_eq!(
                built,
                Script::new(&format!("{PRELUDE}{body}")).get_hash(),
                "{name}"
            );
            assert_ne!(built, Script::new(body).get_hash(), "{name}");
            assert_ne!(
                built,
                Script::new(&format!("{PRELUDE}{PRELUDE}{body}")).get_hash(),
                "{name}"
            );
            assert!(hashes.insert(built), "{name} has another script's hash");

            // Each file opens with the comment block that says what the
            // script reads and writes.
            assert!(body.starts_with(&format!("-- {name}: ")), "{name}");
            for clause in ["KEYS[1]", "Reads", "Writes", "Returns"] {
                assert!(body.contains(&format!("-- {clause}")), "{name}: {clause}");
            }
            let body = &code_only(body);
            // A body defines no helper of its own (nor redefines one)...
            assert_eq!(defined(body), Vec::<&str>::new(), "{name}");
            assert!(!body.contains("replicate_commands"), "{name}");
            // ... and every function it calls is the prelude's or Lua's.
            let calls = called(body);
            assert!(calls.contains(&"now_ms"), "{name} reads the server's clock");
            for f in calls {
                assert!(
                    helpers.contains(&f) || LUA_GLOBALS.contains(&f),
                    "the {name} script calls {f}, which the prelude does not define"
                );
            }
        }
        assert_eq!(hashes.len(), SCRIPTS.len());
        // The prelude's own helpers call only each other or Lua.
        for f in called(&prelude) {
            assert!(
                helpers.contains(&f) || LUA_GLOBALS.contains(&f),
                "the prelude calls {f}"
            );
        }
    }

    #[test]
    fn the_call_scanner_sees_free_calls_only() {
        // The scanner the test above relies on.
        assert_eq!(
            called("local x = now_ms() + int(redis.call('TIME')) .. s:sub(1) and (y)"),
            ["now_ms", "int"]
        );
        assert_eq!(
            defined("local function a(x) end local function b() end"),
            ["a", "b"]
        );
    }
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;
