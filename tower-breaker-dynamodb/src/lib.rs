//! [`DynamoDbStore`]: the shared decision of a fleet's breakers in a
//! DynamoDB table, a [`Store`] for [`tower_breaker`], for fleets of short-lived processes
//! (AWS Lambda functions, say) that have DynamoDB at hand and no Redis.
//!
//! # The table
//!
//! One table (default name [`DEFAULT_TABLE`]) with a string partition key
//! `pk` and no sort key; its time-to-live attribute is `expires_at`.
//! [`DynamoDbStore::create_table`] creates it (on-demand billing) and turns
//! the TTL on, when asked: for tests and first runs, never implicitly. With
//! the AWS CLI:
//!
//! ```text
//! aws dynamodb create-table --table-name tower-breaker \
//!     --attribute-definitions AttributeName=pk,AttributeType=S \
//!     --key-schema AttributeName=pk,KeyType=HASH --billing-mode PAY_PER_REQUEST
//! aws dynamodb update-time-to-live --table-name tower-breaker \
//!     --time-to-live-specification Enabled=true,AttributeName=expires_at
//! ```
//!
//! The store needs `dynamodb:GetItem`, `dynamodb:PutItem` and
//! `dynamodb:UpdateItem` on the table (and `CreateTable`,
//! `DescribeTable`, `UpdateTimeToLive` only for `create_table`).
//!
//! # The item
//!
//! One item per breaker, at `pk` = prefix + name (default prefix empty):
//!
//! | attribute | what |
//! |---|---|
//! | `state` | `open`, or `closed` once a prober closed the circuit |
//! | `until_ms` | T, milliseconds since the epoch, by the writer's clock |
//! | `period_ms` | the length of the current opening |
//! | `ver` | a random version, new at every state write; the elected prober's token while it probes |
//! | `reopens` | failed probes in a row since the circuit last closed |
//! | `lease_until_ms`, `lease_ms` | the elected prober's lease: its end (writer's clock; 0: no prober) and its length |
//! | `since_ms` | when the item was last written, writer's clock |
//! | `expires_at` | the TTL, seconds since the epoch: some time ([`DynamoDbOptions::cleanup_after`]) after T, the lease or the close |
//! | `w{tick}` | a bucket of the fleet's window: calls + failures x 10^12 + slow calls x 10^24, for the bucket starting at tick x the bucket's length (since the epoch) |
//! | `g{at}`, `g{at}f` | a part of the fleet's count window (for breakers that count their calls), packed the same way: a report's calls before its failures in a row, placed at `at` (writer's clock, ms since the epoch), and those failures (`f`) |
//! | `bl{epoch}`, `bc{epoch}` | the fleet's retry budget ([`Store::claim_retry`]) in an epoch of its window: the credit left in millionths of a retry (what the fleet's requests earned, less a million per claim) and the claims |
//!
//! With [`DynamoDbOptions::window_shards`], the window and the retry
//! budget live in shard items instead (`pk` = the breaker's key, `%shard`
//! and a number), and the breaker's item keeps the state alone.
//!
//! # Writes
//!
//! Every change of state is a strongly consistent read, a decision taken
//! from the item (the same rules as the Redis store's scripts), and a
//! `PutItem` conditioned on the item being unchanged: `ver = :seen` (or
//! `attribute_not_exists(pk)` when there was no item, or
//! `attribute_not_exists(ver)` on an item that holds only a window). A
//! writer that loses the race reads again and decides again. So:
//!
//! - **open** ([`Store::try_open`]): writes T only if the circuit is not
//!   open or its T has passed; concurrent openers never push T forward,
//!   the others adopt the first writer's T.
//! - **elect** ([`Store::try_acquire_probe`]): exactly one winner per
//!   version, whatever the clocks say, because the winner's write changes
//!   the version every other contender is conditioned on. It moves T
//!   forward one period and holds a short lease for its probe. While that
//!   lease runs, reads and lost elections say so ([`Decision::Probing`],
//!   [`Election::Probing`]: T and the time left of the lease), so that the
//!   fleet's breakers tell their refused callers to come back about when
//!   the probe should have ended, not at T.
//! - **renew** ([`Store::renew_probe`]): while its probe runs, the winner
//!   renews its lease every third of it, fenced by its token; each
//!   renewal writes a new version (handed back as the winner's new
//!   token), so contenders that time the lease by what they saw start
//!   counting again. A prober that dies or freezes stops renewing and is
//!   taken over one lease (plus the tolerated skew) later.
//! - **release** ([`Store::release_probe`]): a winner with no call to
//!   probe with gives the probe back, fenced by its token: T is now, no
//!   lease, a fresh version; the next candidate wins at once.
//! - **close** and **reopen** ([`Store::close`], [`Store::reopen`]):
//!   fenced by the winner's token (the version its election wrote): a
//!   stale prober cannot close or re-open a circuit the fleet re-opened or
//!   re-elected since.
//! - **report** ([`Store::report`]): one `UpdateItem` that `ADD`s this
//!   process's counts, packed into one number, to the attribute of the
//!   current bucket (creating it when it is the bucket's first report), on
//!   the one condition that the circuit is not open. The new item comes
//!   back with the write, so the fleet's rates are judged without another
//!   read; when they break the rule, an **open** follows. Buckets older
//!   than the window are removed by the next report, and an **open**
//!   rewrites the item without them. Windows longer than 20 buckets are
//!   kept in 20 longer ones. A breaker that counts its calls
//!   ([`FleetRule::count_window`]) `ADD`s its report as at most two parts
//!   of the fleet's count window instead (its failures in a row now, its
//!   other calls when they were made, see [`Report::segments`]); the
//!   fleet's newest calls are judged ([`FleetRule::judge_segments`]) and
//!   the parts that no longer count are removed by the next report. The
//!   SDK's retries are off for this write: a lost answer must not count a
//!   report twice. The report's retry credit ([`Report::credit`]) is
//!   added in the same write.
//! - **claim** ([`Store::claim_retry`]): one `UpdateItem` that adds a
//!   claim to the current epoch and takes a million off its credit left,
//!   on the condition that the fleet's budget grants it
//!   ([`BudgetRule::grants`]: the previous epoch's counts, which no longer
//!   change, enter the condition as numbers, from the last report's
//!   answer). No retries by the SDK either.
//!
//! # Clocks
//!
//! DynamoDB has no server clock: every time in the item is the writer's,
//! every comparison uses the reader's ([`DynamoDbOptions::clock`], the
//! system clock by default). The store tolerates clocks that disagree by
//! up to [`DynamoDbOptions::max_clock_skew`] (default 1 s; EC2 and Lambda
//! hosts keep within milliseconds through the Amazon Time Sync Service):
//!
//! - **One prober, whatever the skew.** The election is a compare-and-set
//!   on the version, so two processes never both win the same election.
//! - **A prober's lease is respected.** A contender takes the fleet's
//!   probe over from an elected prober only when the lease is over by its
//!   own clock *plus* the tolerated skew, or when it has itself seen the
//!   same version, unchanged, for the lease's whole length (the approach of
//!   the AWS Labs DynamoDB lock client: only clock *rates* must agree).
//!   Within the bound, a slow prober is never joined by a second one.
//! - **Open periods.** A reader whose clock runs ahead by δ sees T δ
//!   early, so its process may ask for the probe δ early; one whose clock
//!   runs behind never waits more than the opening's own period.
//!
//! Beyond the bound, a contender whose clock runs ahead by more than the
//! skew can elect a second prober while a slow first one is still within
//! its lease (only if the first probe takes nearly its whole lease); and a
//! process whose clock is behind the fleet's by more than the fleet's
//! window has its reports refused with an error (the `circuit_store_failed`
//! alarm), so it keeps deciding alone.
//!
//! # Capacity
//!
//! Items stay under 1 KB: a write costs one write capacity unit, a
//! (strongly consistent) read one read capacity unit. On the closed path
//! there is no request; each breaker reads or reports once per
//! [`refresh_interval`](tower_breaker::FleetConfig::refresh_interval) (60 requests
//! a minute per breaker and process by default), and reports at most every
//! [`flush_interval`](tower_breaker::FleetConfig::flush_interval) while failures
//! arrive. On-demand tables bill per request: for large fleets, raise both.
//! [`DynamoDbStore::usage`] counts requests and the capacity the service
//! reported; [`DynamoDbStore::item_writes`] the writes per item.
//!
//! **One item per breaker is the whole fleet's hot key.** A partition
//! serves at most 1,000 write units and 3,000 read units a second, whatever
//! the table's billing. The writes to a breaker's item, a second, are
//! about:
//!
//! | the fleet | reports a second, one item |
//! |---|---|
//! | N long-lived processes, healthy | N / refresh interval (N at 1 s) |
//! | N long-lived processes, failures arriving | N / flush interval (10 N at 100 ms) |
//! | Lambda functions that flush after each invocation | the invocations a second that called the dependency |
//!
//! plus the retry claims (at most the budget: about a tenth of the
//! requests, and one refused claim per process and refresh interval) and a
//! few writes per change of state. So about 100 busy processes saturate an
//! item while failures arrive, and a Lambda function saturates it at about
//! 1,000 invocations a second. A throttled write is known not to be
//! applied: its report is carried by the next one, never doubled, but the
//! fleet learns late, and elections and openings, on the same item, are
//! throttled too.
//!
//! Keep each item under about half the limit: past 500 reports a second,
//! spread the window over `ceil(reports a second / 500)` items with
//! [`DynamoDbOptions::window_shards`]. Each process then reports to one
//! shard (one write there, and one strongly consistent read of the
//! breaker's item: 3,000 a second before its read limit), and each shard
//! judges its share of the calls with the minimum scaled down, so shard
//! only a fleet large enough that every shard sees the rule's minimum
//! quickly. The fleet's retry budget is sharded alike. A slower refresh
//! and flush interval, for long-lived processes, lowers the rate too, at
//! the price of learning later.
//!
//! # How fast a fleet opens
//!
//! DynamoDB has no pushes the store could use cheaply (Streams need a
//! consumer): a breaker learns of another process's decision at its next
//! store call: a report (every
//! [`flush_interval`](tower_breaker::FleetConfig::flush_interval), 100 ms,
//! while its own failures arrive), its periodic read (every refresh
//! interval), or the read before a call whose decision is older than
//! [`max_staleness`](tower_breaker::FleetConfig::max_staleness). So, for N
//! processes at r calls a second each, the calls that reach a dependency
//! that starts failing fast, until every process refuses, are about
//!
//! ```text
//! what the fleet's window needs to trip  +  N × r × (flush interval + a round trip)
//! ```
//!
//! against about N × `minimum_calls` / failure-rate threshold when each
//! process trips on its own window (N × 20 with the defaults, after
//! healthy traffic):
//!
//! | per process | processes | the fleet on DynamoDB | each process alone |
//! |---|---:|---:|---:|
//! | 1 call/s | 20 | 10 (measured, `tests/dynamodb_fleet.rs`, max staleness 800 ms) | 200 |
//! | 50 calls/s | 5 | 30 to 50 (measured on moto) | 50 |
//! | 50 calls/s | 20 | about 140 (10 + 20 × 50 × 130 ms, computed) | 200 |
//!
//! At a few calls a second per process (the serverless fleet the store
//! is built for) the fleet opens after about as many calls as one
//! process's window needs. At tens of calls a second per process each
//! process's own window trips nearly as soon as a report could tell it:
//! there the Redis store, whose pushes reach every process within a round
//! trip, opens a 20-process fleet at 50 calls a second after at most 30
//! calls; on DynamoDB, a shorter flush interval lowers the bound in
//! proportion, at that many more writes a second to the item while
//! failures arrive (see the capacity table above). The 20-process run at
//! 50 calls a second is computed, not measured: moto, the local DynamoDB
//! the tests run against, serves about 80 reports a second, and that
//! fleet sends 200.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};
//! use tower_breaker::{Breaker, BreakerConfig};
//!
//! # async fn run(sdk_config: &aws_sdk_dynamodb::Config) -> Result<(), tower_breaker::BoxError> {
//! // In a Lambda function: `aws_config::load_from_env().await` gives the config.
//! let client = aws_sdk_dynamodb::Client::from_conf(sdk_config.clone());
//! let store = DynamoDbStore::new(client, DynamoDbOptions::new().table("circuits"))?;
//! let config = BreakerConfig::new().store(Arc::new(store));
//! let breaker = Breaker::try_with_config("payments", config)?;
//! breaker.refresh().await?; // learn the fleet's circuit before serving
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConsumedCapacity, KeySchemaElement, KeyType,
    ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TableStatus, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;

mod record;

/// The `aws-sdk-dynamodb` crate this store is built on (the 1.x line), for
/// the `aws_sdk_dynamodb::Client` that [`DynamoDbStore::new`] takes: build
/// it with this re-export (from an `aws-config` of the same release train)
/// and its version always matches the store's. A new major of the SDK is a
/// new major of this crate.
///
/// # Example
///
/// ```no_run
/// use tower_breaker_dynamodb::{aws_sdk_dynamodb, DynamoDbOptions, DynamoDbStore};
///
/// # fn run(config: &aws_sdk_dynamodb::Config) -> Result<(), tower_breaker::BoxError> {
/// let client = aws_sdk_dynamodb::Client::from_conf(config.clone());
/// let store = DynamoDbStore::new(client, DynamoDbOptions::new().table("circuits"))?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
pub use aws_sdk_dynamodb;

use record::{
    bucket_attr, decide, expiry_secs, millis, pack, segment_attr, segments, Item, Phase, Record,
    Window,
};
use tower_breaker::store::{
    BudgetRule, Decision, Election, FleetRule, ProbeToken, Report, Segment, Store, StoreError,
    StoreFuture, Tokens,
};

/// The most items a breaker's window can be spread over
/// ([`DynamoDbOptions::window_shards`]).
pub const MAX_WINDOW_SHARDS: u32 = 64;

/// The default table name: `"tower-breaker"`.
pub const DEFAULT_TABLE: &str = "tower-breaker";
/// The default bound of one store call (a read and, when it decides to
/// write, a conditional write): 200 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
/// The default clock skew the store tolerates between processes: 1 s.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The default time an item is kept after its T: 10 minutes.
pub const DEFAULT_CLEANUP_AFTER: Duration = tower_breaker::store::DEFAULT_CLEANUP_AFTER;
/// The longest breaker name kept as it is: 200 bytes. A longer one is
/// kept as its first bytes and a hash of the whole
/// ([`bounded_name`](tower_breaker::store::bounded_name)), never refused.
pub const MAX_NAME_LEN: usize = 200;
/// The longest key prefix: 64 bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// Whether DynamoDB refused a request with this error code before running
/// it: throttling, a missing table, a permission, a bad request. Any other
/// failure (a timeout, an internal error, no answer) may have been
/// applied.
fn refused_before_running(code: &str) -> bool {
    matches!(
        code,
        "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "ResourceNotFoundException"
            | "AccessDeniedException"
            | "UnrecognizedClientException"
            | "ValidationException"
            | "ConditionalCheckFailedException"
    )
}

/// How often a store call reads and decides again after losing a race of
/// conditional writes before it gives up with an error.
const MAX_TRIES: usize = 8;

/// The most stale buckets or parts of a count window one report removes
/// (more go with the next).
const MAX_REMOVED: usize = 16;

/// How many parts of a count window an item may hold before the report
/// that finds more removes the stale ones at once (one more write), rather
/// than leaving them for this process's next report: in a fleet of many
/// rarely invoked processes, that next report comes late, and every other
/// process's parts pile up meanwhile (an item of 300 environments grew to
/// 230 parts, 7.5 KB, and moto fell behind).
const MAX_PARTS: usize = 32;

/// The most keys whose stale attributes a store remembers for their next
/// report: keys that never report again (a keyed registry's evicted keys)
/// must not grow the map without bound.
const MAX_STALE_KEYS: usize = 1024;

/// Remembers the attributes of `key` to remove with its next report. A map
/// that holds [`MAX_STALE_KEYS`] keys starts again empty: a key forgotten
/// that way finds its stale attributes again in the item its next report
/// returns, and removes them one report later.
fn remember_stale(map: &mut HashMap<String, Vec<String>>, key: String, stale: Vec<String>) {
    if map.len() >= MAX_STALE_KEYS && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, stale);
}

/// A [`Store`] in a DynamoDB table: the breakers of every process that
/// uses the same table, prefix and breaker name share one circuit.
///
/// See the [module docs](self) for the table, the item, the conditional
/// writes and the clock rules.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};
/// use tower_breaker::store::{Decision, Store};
///
/// # async fn run(client: aws_sdk_dynamodb::Client) -> Result<(), tower_breaker::BoxError> {
/// let store = DynamoDbStore::new(
///     client,
///     DynamoDbOptions::new().table("circuits").prefix("shop:").timeout(Duration::from_millis(100)),
/// )?;
/// store.create_table().await?; // first run only
/// assert_eq!(store.key("payments")?, "shop:payments");
///
/// store.try_open("payments", Duration::from_secs(5)).await?;
/// assert!(matches!(store.read("payments").await?, Decision::Open { .. }));
/// # Ok(())
/// # }
/// ```
pub struct DynamoDbStore {
    client: Client,
    options: DynamoDbOptions,
    tokens: Tokens,
    /// This store's shard of every window, when they are sharded (a
    /// random number, taken modulo the shards).
    shard: u64,
    /// Per key, the elected prober's version this process saw last and
    /// when it first saw it (its own clock): the lock client's rule.
    seen: Mutex<HashMap<String, (u64, u64)>>,
    /// Per key, the buckets older than the window that the last report
    /// found in the item: the next report removes them.
    stale: Mutex<HashMap<String, Vec<String>>>,
    /// Per item, the last epoch of its retry budget that is over, as a
    /// report's answer or a read showed it: (epoch, claims, credit left).
    /// An epoch that is over no longer changes, so a claim needs no read
    /// of it (at most [`MAX_STALE_KEYS`] items).
    budget_before: Mutex<HashMap<String, (u64, i128, i128)>>,
    usage: Counters,
}

/// The settings of a [`DynamoDbStore`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_breaker_dynamodb::DynamoDbOptions;
///
/// let options = DynamoDbOptions::new()
///     .table("circuits")
///     .prefix("checkout:")
///     .timeout(Duration::from_millis(100))
///     .max_clock_skew(Duration::from_millis(250));
/// assert!(options.check().is_ok());
/// assert!(DynamoDbOptions::new().table("a b").check().is_err());
/// ```
#[derive(Clone)]
#[must_use]
pub struct DynamoDbOptions {
    table: String,
    prefix: String,
    timeout: Duration,
    cleanup_after: Duration,
    max_clock_skew: Duration,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    window_shards: u64,
}

/// What a [`DynamoDbStore`] has asked of DynamoDB so far: requests, and
/// the capacity units the service reported for them (DynamoDB bills
/// on-demand tables per request unit).
///
/// # Example
///
/// ```
/// use tower_breaker_dynamodb::Usage;
///
/// let usage = Usage::default();
/// assert_eq!(usage.reads + usage.writes, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct Usage {
    /// `GetItem` requests.
    pub reads: u64,
    /// `PutItem` and `UpdateItem` requests, including conditional writes
    /// whose condition failed (they are billed too).
    pub writes: u64,
    /// Read capacity units the service reported.
    pub read_units: f64,
    /// Write capacity units the service reported.
    pub write_units: f64,
    /// Of the writes, those refused because another process had written
    /// first (their condition failed): contention, retried by the store.
    pub refused: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    /// Capacity units in thousandths.
    read_units: AtomicU64,
    write_units: AtomicU64,
    refused: AtomicU64,
    /// Writes per item (at most [`MAX_STALE_KEYS`] items; the counts start
    /// again when more are written).
    per_item: Mutex<HashMap<String, u64>>,
}

impl Counters {
    /// One write request to the item `key`.
    fn wrote(&self, key: &str) {
        self.writes.fetch_add(1, Relaxed);
        let mut map = self.per_item.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_STALE_KEYS && !map.contains_key(key) {
            map.clear();
        }
        *map.entry(key.to_owned()).or_default() += 1;
    }
}

/// What a decision asks of the item.
enum Step<T> {
    /// Nothing to write: the answer.
    Done(T),
    /// Write this record (conditioned on the item being as read), then
    /// answer.
    Write(Record, T),
}

// === impl DynamoDbOptions ===

impl DynamoDbOptions {
    /// Every default: table [`DEFAULT_TABLE`], no prefix, timeout
    /// [`DEFAULT_TIMEOUT`], cleanup after [`DEFAULT_CLEANUP_AFTER`], skew
    /// [`DEFAULT_MAX_CLOCK_SKEW`], the system clock.
    pub fn new() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
            prefix: String::new(),
            timeout: DEFAULT_TIMEOUT,
            cleanup_after: DEFAULT_CLEANUP_AFTER,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            clock: Arc::new(SystemTime::now),
            window_shards: 1,
        }
    }

    /// Spreads the fleet's window and retry budget of each breaker over
    /// `shards` items (default 1, at most [`MAX_WINDOW_SHARDS`]), so that
    /// the reports of a large fleet do not all write one item: each
    /// process reports to one shard, chosen at random when its store is
    /// built, and each shard judges its share of the fleet's calls by the
    /// rule scaled to it (`minimum_calls` and the count window divided by
    /// `shards`, rounded up; the rates unchanged); the retry budget's
    /// claims are drawn from the process's shard, with the floor divided
    /// alike. A shard that breaks the rule opens the breaker's own item,
    /// and every decision is still that item's. A sharded report is two
    /// requests (its shard's `UpdateItem`, then a read of the breaker's
    /// item) instead of one. See the [crate docs](crate#capacity) for when
    /// to shard: only fleets whose reports would pass a partition's write
    /// limit need it, and a small fleet judged in shards opens on less
    /// evidence.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_dynamodb::DynamoDbOptions;
    ///
    /// let options = DynamoDbOptions::new().window_shards(8);
    /// assert_eq!(options.window_shards_value(), 8);
    /// assert_eq!(DynamoDbOptions::new().window_shards(0).window_shards_value(), 1);
    /// ```
    pub fn window_shards(mut self, shards: u32) -> Self {
        self.window_shards = u64::from(shards.clamp(1, MAX_WINDOW_SHARDS));
        self
    }

    /// The shards of each breaker's window (see
    /// [`window_shards`](Self::window_shards)).
    pub fn window_shards_value(&self) -> u32 {
        u32::try_from(self.window_shards).unwrap_or(MAX_WINDOW_SHARDS)
    }

    /// The table (default [`DEFAULT_TABLE`]).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The prefix of every partition key (default none): the key of a
    /// breaker is the prefix followed by its name. Give each environment
    /// sharing a table its own.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest wait for one store call (default 200 ms; at least
    /// 1 ms), its read and its conditional write together, the SDK's own
    /// retries included. Past it the call fails and the breaker keeps its
    /// local decision.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long an item is kept after its T, its lease or its close
    /// (default 10 minutes): the TTL attribute. Cleanup only: every read
    /// compares T with the clock, and an item past its TTL (which DynamoDB
    /// may still return for days) reads as missing.
    pub fn cleanup_after(mut self, after: Duration) -> Self {
        self.cleanup_after = after;
        self
    }

    /// The clock skew between processes the store tolerates (default 1 s):
    /// a contender waits this long past the end of an elected prober's
    /// lease, by its own clock, before it takes the probe over (see the
    /// [module docs](self#clocks)).
    pub fn max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = skew;
        self
    }

    /// The wall clock the store writes and compares its times with
    /// (default [`SystemTime::now`]). For tests of skewed clocks.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Checks the table name and the prefix.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] saying what is wrong: a table name of 3 to 255
    /// letters, digits, `_`, `-` and `.`; a prefix of at most
    /// [`MAX_PREFIX_LEN`] bytes, empty or ending with `:` (so that no two
    /// prefixes' keys meet: `a:` + `b` and `a` + `:b` would).
    pub fn check(&self) -> Result<(), StoreError> {
        let table_ok = (3..=255).contains(&self.table.len())
            && self
                .table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !table_ok {
            return Err(StoreError::new(format!(
                "invalid dynamodb table name {:?}: 3 to 255 letters, digits, '_', '-' or '.'",
                self.table
            )));
        }
        if self.prefix.len() > MAX_PREFIX_LEN {
            return Err(StoreError::new(format!(
                "invalid key prefix {:?} for the dynamodb circuit store: it is longer than {MAX_PREFIX_LEN} bytes",
                self.prefix
            )));
        }
        if !self.prefix.is_empty() && !self.prefix.ends_with(':') {
            return Err(StoreError::new(format!(
                "invalid key prefix {:?} for the dynamodb circuit store: it must end with ':', so that no other prefix's keys are also its own",
                self.prefix
            )));
        }
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        (self.clock)()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4))
    }
}

impl Default for DynamoDbOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DynamoDbOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbOptions")
            .field("table", &self.table)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("cleanup_after", &self.cleanup_after)
            .field("max_clock_skew", &self.max_clock_skew)
            .field("window_shards", &self.window_shards)
            .finish_non_exhaustive()
    }
}

// === impl DynamoDbStore ===

impl DynamoDbStore {
    /// A store on `client` (built from your AWS configuration).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the options are refused
    /// ([`DynamoDbOptions::check`]).
    pub fn new(client: Client, options: DynamoDbOptions) -> Result<Self, StoreError> {
        options.check()?;
        Ok(Self {
            client,
            options,
            shard: Tokens::new().draw(),
            tokens: Tokens::new(),
            seen: Mutex::new(HashMap::new()),
            stale: Mutex::new(HashMap::new()),
            budget_before: Mutex::new(HashMap::new()),
            usage: Counters::default(),
        })
    }

    /// The partition key of the breaker named `name`: the prefix followed
    /// by the name, its `%` and `:` written `%25` and `%3A`, so that the
    /// prefix's last `:` is the only one after the prefix and no two
    /// (prefix, name) pairs share a key.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the name is empty. A name longer than
    /// [`MAX_NAME_LEN`] bytes is kept as
    /// [`bounded_name`](tower_breaker::store::bounded_name) makes it.
    pub fn key(&self, name: &str) -> Result<String, StoreError> {
        if name.is_empty() {
            return Err(StoreError::new(
                "invalid breaker name \"\" for the dynamodb circuit store: it is empty",
            ));
        }
        // A longer name is kept in a bounded form: its first bytes and a
        // hash of the whole, the same in every process.
        let name = tower_breaker::store::bounded_name(name, MAX_NAME_LEN);
        let mut key = String::with_capacity(self.options.prefix.len() + name.len());
        key.push_str(&self.options.prefix);
        for c in name.chars() {
            match c {
                '%' => key.push_str("%25"),
                ':' => key.push_str("%3A"),
                c => key.push(c),
            }
        }
        Ok(key)
    }

    /// The options the store was built with.
    pub fn options(&self) -> &DynamoDbOptions {
        &self.options
    }

    /// The requests made so far and the capacity the service reported.
    pub fn usage(&self) -> Usage {
        let units = |a: &AtomicU64| a.load(Relaxed) as f64 / 1000.0;
        Usage {
            reads: self.usage.reads.load(Relaxed),
            writes: self.usage.writes.load(Relaxed),
            read_units: units(&self.usage.read_units),
            write_units: units(&self.usage.write_units),
            refused: self.usage.refused.load(Relaxed),
        }
    }

    /// The write requests this store sent to each item so far (the
    /// items' keys; at most 1,024 items, then the counts start again): a
    /// partition serves at most 1,000 write units a second, so sample it
    /// to find a fleet's hot item (see the crate docs on capacity).
    ///
    /// # Example
    ///
    /// ```
    /// # use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};
    /// # fn show(store: &DynamoDbStore) {
    /// for (item, writes) in store.item_writes() {
    ///     println!("{item}: {writes} writes");
    /// }
    /// # }
    /// ```
    pub fn item_writes(&self) -> Vec<(String, u64)> {
        let map = self
            .usage
            .per_item
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Creates the table (partition key `pk`, on-demand billing) if it
    /// does not exist, waits until it is active (at most 60 s), and turns
    /// its TTL on `expires_at` on. For tests and first runs; the store
    /// never calls it by itself.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a request fails (for a reason other than the
    /// table or its TTL existing already) or the table is not active in
    /// time.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let table = &self.options.table;
        let created = self
            .client
            .create_table()
            .table_name(table)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(record::PK)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(|e| StoreError::with_source("table definition", e))?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(record::PK)
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(|e| StoreError::with_source("table definition", e))?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        if let Err(e) = created {
            if !e
                .as_service_error()
                .is_some_and(|e| e.is_resource_in_use_exception())
            {
                return Err(self.sdk_error("create the table", e));
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let described = self
                .client
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| self.sdk_error("describe the table", e))?;
            let status = described.table().and_then(|t| t.table_status());
            if status == Some(&TableStatus::Active) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::new(format!(
                    "table {table:?} is not active after 60 s (status {status:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ttl = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(record::EXPIRES)
            .build()
            .map_err(|e| StoreError::with_source("ttl definition", e))?;
        match self
            .client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(ttl)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            // DynamoDB refuses to enable a TTL that is enabled already.
            Err(e) if e.message().is_some_and(|m| m.contains("already enabled")) => Ok(()),
            Err(e) => Err(self.sdk_error("turn the table's TTL on", e)),
        }
    }

    /// A failed request: the service's error code and message (or the
    /// SDK's error chain when the request got no answer), and the table.
    fn sdk_error<E>(&self, what: &str, e: E) -> StoreError
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        let detail = match (e.code(), e.message()) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code.to_owned(),
            _ => {
                // The error's chain of causes, without the SDK's debug dump.
                let mut text = e.to_string();
                let mut cause = e.source();
                while let Some(c) = cause {
                    text.push_str(": ");
                    text.push_str(&c.to_string());
                    cause = c.source();
                }
                text
            }
        };
        let hint = if e.code() == Some("ResourceNotFoundException") {
            " (create the table: see `DynamoDbStore::create_table`)"
        } else {
            ""
        };
        let not_applied = e.code().is_some_and(refused_before_running);
        let error = StoreError::with_source(
            format!(
                "dynamodb table {:?}: could not {what}: {detail}{hint}",
                self.options.table
            ),
            e,
        );
        if not_applied {
            error.not_applied()
        } else {
            error
        }
    }

    /// Runs `op` bounded by the timeout.
    async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tower_breaker::store::within(self.options.timeout, op).await {
            Ok(result) => result,
            Err(elapsed) => Err(StoreError::with_source(
                format!("no answer from dynamodb within {:?}", self.options.timeout),
                elapsed,
            )),
        }
    }

    /// Reads the item, decides with `step` and writes what it asks for,
    /// conditioned on the item being as read; reads and decides again
    /// when another writer came first.
    async fn transact<T>(
        &self,
        name: &str,
        mut step: impl FnMut(&str, Option<&Record>, u64) -> Result<Step<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let key = self.key(name)?;
        self.bounded(async {
            // A write whose condition failed may have landed all the same:
            // the SDK retried it after its answer was lost, and the retry
            // found the item already changed, by itself. Its version tells.
            let mut refused: Option<(Option<u64>, T)> = None;
            for _ in 0..MAX_TRIES {
                let seen = self.get(&key).await?.as_ref().map(Record::decode);
                if let Some((version, answer)) = refused.take() {
                    if version.is_some() && seen.as_ref().map(|r| r.version) == Some(version) {
                        return Ok(answer);
                    }
                }
                let now = self.options.now_ms();
                match step(&key, seen.as_ref(), now)? {
                    Step::Done(answer) => return Ok(answer),
                    Step::Write(record, answer) => {
                        if self.put(&key, &record, now, seen.as_ref()).await? {
                            return Ok(answer);
                        }
                        refused = Some((record.version, answer));
                    }
                }
            }
            Err(StoreError::new(format!(
                "dynamodb item {key:?} changed under {MAX_TRIES} conditional writes in a row"
            )))
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.options.table)
            .key(record::PK, AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        self.usage.reads.fetch_add(1, Relaxed);
        let out = out.map_err(|e| self.sdk_error("read the circuit", e))?;
        add_units(&self.usage.read_units, out.consumed_capacity());
        Ok(out.item)
    }

    /// Puts `record` if the item is still as `seen`. Returns whether it
    /// wrote.
    async fn put(
        &self,
        key: &str,
        record: &Record,
        now: u64,
        seen: Option<&Record>,
    ) -> Result<bool, StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.options.table)
            .set_item(Some(record.encode(
                key,
                now,
                millis(self.options.cleanup_after),
            )))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let put = match seen.map(|r| r.version) {
            None => put
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", record::PK),
            Some(None) => put
                .condition_expression("attribute_not_exists(#ver)")
                .expression_attribute_names("#ver", record::VERSION),
            Some(Some(version)) => put
                .condition_expression("#ver = :ver")
                .expression_attribute_names("#ver", record::VERSION)
                .expression_attribute_values(":ver", AttributeValue::N(version.to_string())),
        };
        let out = put.send().await;
        self.usage.wrote(key);
        match out {
            Ok(out) => {
                add_units(&self.usage.write_units, out.consumed_capacity());
                Ok(true)
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                self.usage.refused.fetch_add(1, Relaxed);
                Ok(false)
            }
            Err(e) => Err(self.sdk_error("write the circuit", e)),
        }
    }

    /// The decision of **open**, shared by `try_open` and `report`.
    async fn open(&self, name: &str, open_for: Duration) -> Result<Duration, StoreError> {
        let period = millis(open_for);
        self.transact(name, |_, seen, now| {
            let seen = seen.filter(|r| !r.gone(now, millis(self.options.cleanup_after)));
            if let Some(r) = seen.filter(|r| r.open_ahead(now)) {
                return Ok(Step::Done(ms(r.remaining(now))));
            }
            let reopens = match seen {
                Some(r) if r.phase == Phase::Open => r.reopens,
                _ => 0,
            };
            let record = Record::open(now, now + period, period, reopens, None, self.tokens.draw());
            Ok(Step::Write(record, open_for))
        })
        .await
    }

    /// How long this process has seen the item at `key` hold the version
    /// of `r`, by its own clock (zero at first sight): the AWS Labs lock
    /// client's rule, which needs clock rates, not clocks, to agree.
    fn watched(&self, key: &str, r: &Record, now: u64) -> u64 {
        let version = r.version.unwrap_or(0);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get(key) {
            Some(&(v, first)) if v == version => now.saturating_sub(first),
            _ => {
                // Forget circuits not looked at for an hour, so the map
                // holds only the circuits this process saw open lately.
                if seen.len() >= 1024 {
                    seen.retain(|_, (_, first)| now.saturating_sub(*first) < 3_600_000);
                }
                seen.insert(key.to_owned(), (version, now));
                0
            }
        }
    }

    /// How long the opening of `r` still holds by this process's view:
    /// until T by its clock, but no longer than the opening's period after
    /// it first saw the opening (a clock behind the writer's does not
    /// stretch it). Zero: over.
    fn open_left(&self, key: &str, r: &Record, now: u64) -> u64 {
        let by_clock = r.until.saturating_sub(now);
        if by_clock == 0 || r.period == 0 {
            return by_clock;
        }
        by_clock.min(r.period.saturating_sub(self.watched(key, r, now)))
    }

    /// The decision `record` gives this process at `now`: [`decide`], with
    /// the opening watched, so that a clock behind the writer's cannot
    /// stretch it.
    fn view(&self, key: &str, record: Option<&Record>, now: u64) -> Result<Decision, StoreError> {
        Ok(
            match (
                decide(record, now, millis(self.options.cleanup_after))?,
                record,
            ) {
                (Decision::Open { .. } | Decision::Expired, Some(r))
                    if self.lease_left(key, r, now) > 0 =>
                {
                    Decision::Probing {
                        remaining: ms(self.open_left(key, r, now)),
                        lease: ms(self.lease_left(key, r, now)),
                    }
                }
                (Decision::Open { .. }, Some(r)) => match self.open_left(key, r, now) {
                    0 => Decision::Expired,
                    left => Decision::Open {
                        remaining: ms(left),
                    },
                },
                (decision, _) => decision,
            },
        )
    }

    /// How long the elected prober of `r` still holds its lease: until its
    /// end by the writer's clock plus the tolerated skew, or until this
    /// process has seen the same version for the lease's whole length,
    /// whichever comes first. Zero: no lease, or over.
    fn lease_left(&self, key: &str, r: &Record, now: u64) -> u64 {
        if r.lease_until == 0 {
            return 0;
        }
        let by_clock = (r.lease_until + millis(self.options.max_clock_skew)).saturating_sub(now);
        by_clock.min(r.lease_len.saturating_sub(self.watched(key, r, now)))
    }

    /// `ADD`s each of `adds` (attribute, packed counts: a bucket, or the
    /// parts of a count window) and removes the attributes `stale`, unless
    /// the circuit is open: one `UpdateItem`. Returns the
    /// item after the write, or, when the circuit was open, the decision.
    async fn add(
        &self,
        key: &str,
        adds: &[(String, String)],
        expires: u64,
        stale: &[String],
        now: u64,
    ) -> Result<Result<Item, Decision>, StoreError> {
        let n = |v: String| AttributeValue::N(v);
        let mut update = String::from("ADD ");
        for i in 0..adds.len() {
            let sep = if i == 0 { "" } else { ", " };
            update.push_str(&format!("{sep}#w{i} :v{i}"));
        }
        update.push_str(" SET #exp = :exp");
        let mut request = self
            .client
            .update_item()
            .table_name(&self.options.table)
            .key(record::PK, AttributeValue::S(key.to_owned()))
            // Not open, or an opening gone (past the TTL, or past its own
            // T and lease by the cleanup time: a report revived the item).
            .condition_expression(
                "attribute_not_exists(#st) OR #st <> :open OR #exp < :nows \
                 OR (#until < :gone AND (attribute_not_exists(#lease) OR #lease < :gone))",
            )
            .expression_attribute_names("#st", record::STATE)
            .expression_attribute_names("#exp", record::EXPIRES)
            .expression_attribute_names("#until", record::UNTIL)
            .expression_attribute_names("#lease", record::LEASE)
            .expression_attribute_values(
                ":gone",
                n(now
                    .saturating_sub(millis(self.options.cleanup_after))
                    .to_string()),
            )
            .expression_attribute_values(":open", AttributeValue::S("open".to_owned()))
            .expression_attribute_values(":nows", n((now / 1000).to_string()))
            .expression_attribute_values(":exp", n(expires.to_string()));
        for (i, (attr, value)) in adds.iter().enumerate() {
            request = request
                .expression_attribute_names(format!("#w{i}"), attr)
                .expression_attribute_values(format!(":v{i}"), n(value.clone()));
        }
        // An attribute this write adds to is not also removed (DynamoDB
        // refuses overlapping paths).
        let stale = stale.iter().filter(|a| adds.iter().all(|(b, _)| b != *a));
        for (i, attr) in stale.enumerate() {
            update.push_str(if i == 0 { " REMOVE " } else { ", " });
            update.push_str(&format!("#s{i}"));
            request = request.expression_attribute_names(format!("#s{i}"), attr);
        }
        let out = request
            .update_expression(update)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            // An `ADD` is not idempotent: a retry of a request that was
            // applied but whose answer was lost would count the report
            // twice. Without the SDK's retries a report can be lost, never
            // doubled; the breaker counts the error and goes on.
            .customize()
            .config_override(
                aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled()),
            )
            .send()
            .await;
        self.usage.wrote(key);
        let old = match out {
            Ok(out) => {
                add_units(&self.usage.write_units, out.consumed_capacity());
                return Ok(Ok(out.attributes.unwrap_or_default()));
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                self.usage.refused.fetch_add(1, Relaxed);
                match e.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(failed) => failed.item,
                    _ => None,
                }
            }
            Err(e) => return Err(self.sdk_error("report to the circuit", e)),
        };
        // The circuit is open. Emulators may leave the old item out of the
        // refusal: read it then.
        let old = match old {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        let record = old.as_ref().map(Record::decode);
        Ok(Err(self.view(key, record.as_ref(), now)?))
    }

    async fn report_inner(
        &self,
        name: &str,
        report: Report,
        rule: FleetRule,
    ) -> Result<Decision, StoreError> {
        let key = self.key(name)?;
        let (item_key, rule) = self.shard_of(&key, rule);
        let sharded = item_key != key;
        let now = self.options.now_ms();
        let window = Window::of(&rule);
        let counted = rule.count_window > 0;
        // The parts to add: the report's segments (count window), or its
        // counts in the current bucket.
        let (adds, window_ms): (Vec<(String, String)>, u64) = if counted {
            let adds = report
                .segments(now)
                .map(|s| (segment_attr(&s), pack(s.calls, s.failures, s.slow)))
                .collect();
            (adds, rule.span_ms())
        } else {
            let adds = vec![(
                bucket_attr(window.tick(now)),
                pack(report.calls, report.failures, report.slow),
            )];
            (adds, window.window_ms())
        };
        let expires = expiry_secs(now + window_ms, millis(self.options.cleanup_after));
        let mut stale = self
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&item_key)
            .unwrap_or_default();
        let mut adds = adds;
        if let Some(budget) = rule.budget {
            // The retry budget's epoch: its credit left (earnings less a
            // million per claim) and its claims, in the same write.
            let epoch = budget.epoch(now);
            let left = i128::from(report.credit) + i128::from(report.returned) * 1_000_000;
            if left > 0 {
                adds.push((budget_attr("bl", epoch), left.to_string()));
            }
            if report.returned > 0 {
                adds.push((budget_attr("bc", epoch), format!("-{}", report.returned)));
            }
            for old in [epoch.saturating_sub(2), epoch.saturating_sub(3)] {
                if old + 2 <= epoch {
                    stale.push(budget_attr("bl", old));
                    stale.push(budget_attr("bc", old));
                }
            }
        }
        let mut item = match self.add(&item_key, &adds, expires, &stale, now).await? {
            Ok(item) => item,
            Err(decision) => return Ok(decision),
        };
        if let Some(budget) = rule.budget {
            if let Some(before) = budget.epoch(now).checked_sub(1) {
                self.remember_budget(&item_key, before, &item);
            }
        }
        // A shard holds no state: the breaker's item decides, and evidence
        // from before its last change of state (an opening, an election, a
        // close) never counts.
        let mut older = Vec::new();
        let main = if sharded {
            let main = self.get(&key).await?;
            let record = main.as_ref().map(Record::decode);
            if record.as_ref().is_some_and(|r| r.phase == Phase::Open) {
                return self.view(&key, record.as_ref(), now);
            }
            let since = main
                .as_ref()
                .and_then(|m| m.get(record::SINCE))
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            item.retain(|attr, _| match part_start(attr, window.len_ms) {
                Some(at) if at < since => {
                    older.push(attr.clone());
                    false
                }
                _ => true,
            });
            Some(record)
        } else {
            None
        };
        let (sums, mut stale, behind) = if counted {
            let mut found = segments(&item);
            // Newest first, as the judge orders them, so that the names
            // stay beside their parts.
            found.sort_by(|(_, a), (_, b)| b.at_ms.cmp(&a.at_ms).then(b.failures.cmp(&a.failures)));
            let (names, mut parts): (Vec<String>, Vec<Segment>) = found.into_iter().unzip();
            let newest = parts.first().map_or(0, |p| p.at_ms);
            let (sums, keep) = rule.judge_segments(&mut parts, now);
            let stale = names.into_iter().skip(keep).collect::<Vec<_>>();
            (
                (sums.calls, sums.failures, sums.slow),
                stale,
                newest > now + window_ms,
            )
        } else {
            let tick = window.tick(now);
            let counts = window.counts(&item, tick);
            let stale = counts.stale.iter().map(|t| bucket_attr(*t)).collect();
            (counts.sums, stale, counts.newest >= tick + window.buckets)
        };
        stale.extend(older);
        let parts = item
            .keys()
            .filter(|a| a.starts_with('g') || a.starts_with('w'))
            .count();
        if parts > MAX_PARTS && !stale.is_empty() {
            // Too many for this process's next report: now.
            self.remove_now(&item_key, &stale).await;
            stale.clear();
        }
        if !stale.is_empty() {
            stale.truncate(MAX_REMOVED);
            let mut map = self.stale.lock().unwrap_or_else(|e| e.into_inner());
            remember_stale(&mut map, item_key.clone(), stale);
        }
        if behind {
            // Counted where the others have left it behind (and will
            // remove it): nobody counts it.
            return Err(StoreError::new(format!(
                "report refused: this process's clock is behind the fleet's window of {name:?} by more than the window ({window_ms} ms); check the clocks"
            )));
        }
        let (calls, failures, slow) = sums;
        if rule.breaks(calls, failures, slow) {
            let remaining = self.open(name, rule.open_for).await?;
            return Ok(Decision::Open { remaining });
        }
        match main {
            Some(record) => self.view(&key, record.as_ref(), now),
            None => self.view(&key, Some(&Record::decode(&item)), now),
        }
    }

    /// Removes the attributes `stale` of the item `key`, if it exists: one
    /// `UpdateItem` (at most 100 attributes). A failure is left to the next
    /// report's removals.
    async fn remove_now(&self, key: &str, stale: &[String]) {
        let mut update = String::from("REMOVE ");
        let mut request = self
            .client
            .update_item()
            .table_name(&self.options.table)
            .key(record::PK, AttributeValue::S(key.to_owned()))
            .condition_expression("attribute_exists(#pk)")
            .expression_attribute_names("#pk", record::PK)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        for (i, attr) in stale.iter().take(100).enumerate() {
            if i > 0 {
                update.push_str(", ");
            }
            update.push_str(&format!("#r{i}"));
            request = request.expression_attribute_names(format!("#r{i}"), attr);
        }
        let out = request.update_expression(update).send().await;
        self.usage.wrote(key);
        if let Ok(out) = out {
            add_units(&self.usage.write_units, out.consumed_capacity());
        }
    }

    /// The item a report or a claim of the breaker at `key` goes to, and
    /// the rule scaled to it: `key` and `rule` themselves unless the
    /// windows are sharded.
    fn shard_of(&self, key: &str, rule: FleetRule) -> (String, FleetRule) {
        let shards = self.options.window_shards;
        if shards <= 1 {
            return (key.to_owned(), rule);
        }
        let mut scaled = rule.with_minimum_calls(rule.minimum_calls.div_ceil(shards).max(1));
        if rule.count_window > 0 {
            scaled = scaled.with_count_window(rule.count_window.div_ceil(shards).max(1));
        }
        if let Some(budget) = rule.budget {
            scaled = scaled.with_budget(BudgetRule::new(
                budget.window,
                budget.floor.div_ceil(shards),
            ));
        }
        (shard_key(key, self.shard % shards), scaled)
    }
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("options", &self.options)
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl Store for DynamoDbStore {
    fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
        Box::pin(self.open(name, open_for))
    }

    fn try_acquire_probe<'a>(
        &'a self,
        name: &'a str,
        open_for: Duration,
        lease: Duration,
    ) -> StoreFuture<'a, Election> {
        Box::pin(async move {
            let (period, lease) = (millis(open_for), millis(lease));
            self.transact(name, |key, seen, now| {
                let seen = seen.filter(|r| !r.gone(now, millis(self.options.cleanup_after)));
                let mut reopens = 0;
                let mut last_period = 0;
                if let Some(r) = seen.filter(|r| !r.unreadable) {
                    match r.phase {
                        Phase::Closed => return Ok(Step::Done(Election::Closed)),
                        Phase::Open => {
                            let (left, lease) =
                                (self.open_left(key, r, now), self.lease_left(key, r, now));
                            if lease > 0 {
                                return Ok(Step::Done(Election::Probing {
                                    remaining: ms(left),
                                    lease: ms(lease),
                                }));
                            }
                            if left > 0 {
                                return Ok(Step::Done(Election::Lost {
                                    remaining: ms(left),
                                }));
                            }
                            reopens = r.reopens;
                            last_period = r.period;
                        }
                        Phase::None => {}
                    }
                }
                let period = period.max(last_period);
                let token = self.tokens.draw();
                let record = Record::open(now, now + period, period, reopens, Some(lease), token);
                Ok(Step::Write(
                    record,
                    Election::Won(ProbeToken::new(token).with_reopens(reopens)),
                ))
            })
            .await
        })
    }

    fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            self.transact(name, |_, seen, _| {
                Ok(match seen {
                    Some(r) if r.phase == Phase::Open && r.version == Some(token.get()) => {
                        Step::Write(Record::closed(self.tokens.draw()), true)
                    }
                    _ => Step::Done(false),
                })
            })
            .await
        })
    }

    fn renew_probe<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ProbeToken>> {
        Box::pin(async move {
            let lease = millis(lease);
            self.transact(name, |_, seen, now| {
                Ok(match seen {
                    Some(r) if r.phase == Phase::Open && r.version == Some(token.get()) => {
                        // A fresh version: contenders time the lease from
                        // the last change they saw (by their own clocks),
                        // so each renewal restarts their count.
                        let fresh = self.tokens.draw();
                        let record =
                            Record::open(now, r.until, r.period, r.reopens, Some(lease), fresh);
                        Step::Write(
                            record,
                            Some(ProbeToken::new(fresh).with_reopens(token.reopens())),
                        )
                    }
                    _ => Step::Done(None),
                })
            })
            .await
        })
    }

    fn renews_leases(&self) -> bool {
        true
    }

    fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            self.transact(name, |_, seen, now| {
                Ok(match seen {
                    Some(r) if r.phase == Phase::Open && r.version == Some(token.get()) => {
                        // Open, its period over, no lease, a fresh version
                        // (the old winner is fenced); the re-opens stay.
                        let record =
                            Record::open(now, now, r.period, r.reopens, None, self.tokens.draw());
                        Step::Write(record, true)
                    }
                    _ => Step::Done(false),
                })
            })
            .await
        })
    }

    fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let key = self.key(name)?;
            self.bounded(async {
                let record = self.get(&key).await?.as_ref().map(Record::decode);
                self.view(&key, record.as_ref(), self.options.now_ms())
            })
            .await
        })
    }

    fn reopen<'a>(
        &'a self,
        name: &'a str,
        token: ProbeToken,
        open_for: Duration,
    ) -> StoreFuture<'a, Duration> {
        Box::pin(async move {
            let period = millis(open_for);
            self.transact(name, |_, seen, now| {
                Ok(match seen {
                    Some(r) if r.phase == Phase::Open && r.version == Some(token.get()) => {
                        let until = (now + period).max(r.until);
                        // The opening's period is its effective length:
                        // the read, which caps the time left at the
                        // period (a bound on the writers' clock skew),
                        // then tells what this answers.
                        let record = Record::open(
                            now,
                            until,
                            until - now,
                            r.reopens.saturating_add(1),
                            None,
                            self.tokens.draw(),
                        );
                        Step::Write(record, ms(until - now))
                    }
                    Some(r)
                        if r.open_ahead(now)
                            && !r.gone(now, millis(self.options.cleanup_after)) =>
                    {
                        Step::Done(ms(r.remaining(now)))
                    }
                    _ => Step::Done(Duration::ZERO),
                })
            })
            .await
        })
    }

    fn report<'a>(
        &'a self,
        name: &'a str,
        report: Report,
        rule: FleetRule,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(self.bounded(self.report_inner(name, report, rule)))
    }

    fn check_name(&self, name: &str) -> Result<(), StoreError> {
        self.key(name).map(drop)
    }

    fn claim_retry<'a>(&'a self, name: &'a str, rule: BudgetRule) -> StoreFuture<'a, bool> {
        Box::pin(self.bounded(self.claim(name, rule)))
    }
}

impl DynamoDbStore {
    /// Keeps what `item` holds of the budget's `epoch` (one that is over).
    fn remember_budget(&self, key: &str, epoch: u64, item: &Item) {
        let read = |kind: &str| match item.get(&budget_attr(kind, epoch)) {
            Some(AttributeValue::N(n)) => n.parse::<i128>().unwrap_or(0),
            _ => 0,
        };
        let seen = (epoch, read("bc"), read("bl"));
        let mut map = self.budget_before.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_STALE_KEYS && !map.contains_key(key) {
            map.clear();
        }
        map.insert(key.to_owned(), seen);
    }

    /// Claims a retry: one conditional `UpdateItem` that adds a claim to
    /// the current epoch and takes a million off its credit left, on the
    /// condition that [`BudgetRule::grants`] it. The previous epoch's
    /// counts enter the condition as numbers, from the last report's
    /// answer (or a read, once per epoch, without one).
    async fn claim(&self, name: &str, rule: BudgetRule) -> Result<bool, StoreError> {
        let key = self.key(name)?;
        let shards = self.options.window_shards;
        let (key, rule) = if shards > 1 {
            (
                shard_key(&key, self.shard % shards),
                BudgetRule::new(rule.window, rule.floor.div_ceil(shards)),
            )
        } else {
            (key, rule)
        };
        let now = self.options.now_ms();
        let epoch = rule.epoch(now);
        let before = match epoch.checked_sub(1) {
            None => (0, 0),
            Some(last) => {
                let cached = self
                    .budget_before
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .copied()
                    .filter(|seen| seen.0 == last);
                let seen = match cached {
                    Some(seen) => seen,
                    None => {
                        let item = self.get(&key).await?.unwrap_or_default();
                        self.remember_budget(&key, last, &item);
                        let read = |kind: &str| match item.get(&budget_attr(kind, last)) {
                            Some(AttributeValue::N(n)) => n.parse::<i128>().unwrap_or(0),
                            _ => 0,
                        };
                        (last, read("bc"), read("bl"))
                    }
                };
                (seen.1, seen.2)
            }
        };
        // In millionths: the previous epoch's weighted claims and credit.
        let million: i128 = 1_000_000;
        let weight = i128::from(rule.previous_weight_ppm(now));
        let (claims_before, left_before) = (before.0.max(0), before.1);
        let earned_before = (left_before + claims_before * million).max(0);
        let weighted_claims = claims_before * weight;
        let weighted_credit = earned_before * weight / million;
        // Granted by the floor: claims * 1e6 + weighted claims + 1e6 <=
        // floor * 1e6, that is claims <= this (when not negative).
        let by_floor = i128::from(rule.floor) * million - weighted_claims - million;
        // Granted by the credit: earned - claims * 1e6 (the credit left)
        // >= 1e6 + weighted claims - weighted credit.
        let need = million + weighted_claims - weighted_credit;
        let n = |v: String| AttributeValue::N(v);
        let mut condition = String::from("#bl >= :need");
        if need <= 0 {
            condition.push_str(" OR attribute_not_exists(#bl)");
        }
        let mut request = self
            .client
            .update_item()
            .table_name(&self.options.table)
            .key(record::PK, AttributeValue::S(key.clone()))
            .update_expression("ADD #bc :one, #bl :spend SET #exp = if_not_exists(#exp, :exp)")
            .expression_attribute_names("#bc", budget_attr("bc", epoch))
            .expression_attribute_names("#bl", budget_attr("bl", epoch))
            .expression_attribute_names("#exp", record::EXPIRES)
            .expression_attribute_values(":one", n("1".to_owned()))
            .expression_attribute_values(":spend", n((-million).to_string()))
            .expression_attribute_values(":need", n(need.to_string()))
            // An item the claim creates expires two epochs later at the
            // earliest (an existing one keeps its expiry).
            .expression_attribute_values(
                ":exp",
                n(expiry_secs(now, 2 * rule.window_ms()).to_string()),
            )
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        if by_floor >= 0 {
            condition.push_str(" OR #bc <= :floor OR attribute_not_exists(#bc)");
            request = request
                .expression_attribute_values(":floor", n(by_floor.div_euclid(million).to_string()));
        }
        let out = request
            .condition_expression(condition)
            // Not idempotent: a claim retried after a lost answer would
            // count twice.
            .customize()
            .config_override(
                aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled()),
            )
            .send()
            .await;
        self.usage.wrote(&key);
        match out {
            Ok(out) => {
                add_units(&self.usage.write_units, out.consumed_capacity());
                Ok(true)
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                self.usage.refused.fetch_add(1, Relaxed);
                Ok(false)
            }
            Err(e) => Err(self.sdk_error("claim a retry", e)),
        }
    }
}

/// The item of shard `shard` of the breaker at `key`: the key followed by
/// `%shard` and the number. A breaker's name never holds a raw `%` (it is
/// written `%25` in keys), so no breaker's key is another one's shard.
fn shard_key(key: &str, shard: u64) -> String {
    format!("{key}%shard{shard}")
}

/// When a part of a window starts (writer's clock, ms): a bucket's tick
/// times its length, a count window's part where it was placed; `None`
/// for other attributes.
fn part_start(attr: &str, bucket_ms: u64) -> Option<u64> {
    if let Some(tick) = attr.strip_prefix('w') {
        return tick
            .parse::<u64>()
            .ok()
            .map(|t| t.saturating_mul(bucket_ms));
    }
    let at = attr.strip_prefix('g')?;
    at.strip_suffix('f').unwrap_or(at).parse().ok()
}

/// The attribute of a retry budget's epoch: `bl<epoch>` (credit left, in
/// millionths) or `bc<epoch>` (claims).
fn budget_attr(kind: &str, epoch: u64) -> String {
    format!("{kind}{epoch}")
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn add_units(counter: &AtomicU64, consumed: Option<&ConsumedCapacity>) {
    if let Some(units) = consumed.and_then(ConsumedCapacity::capacity_units) {
        counter.fetch_add((units * 1000.0).round() as u64, Relaxed);
    }
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
#[derive(Debug)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the map of attributes to remove kept an entry for every
    /// key that reported once and never again.
    #[test]
    fn the_stale_map_stays_bounded_whatever_the_keys() {
        let mut map = HashMap::new();
        for i in 0..10_000 {
            remember_stale(&mut map, format!("key {i}"), vec!["w1".to_owned()]);
            assert!(map.len() <= MAX_STALE_KEYS);
        }
        remember_stale(&mut map, "key 9999".to_owned(), vec!["w2".to_owned()]);
        assert_eq!(map["key 9999"], ["w2"]);
    }
}
