//! How the store reaches Redis: the connection every script runs on
//! ([`Connection`]), where it goes and how it logs in ([`RedisTarget`]),
//! and the ways to build a store from them.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, PubSub};
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, Value,
};

use super::{push, RedisOptions, RedisStore};
use tower_breaker::BoxError;

mod node;
#[cfg(feature = "tls")]
mod tls;

use node::{Node, Sentinel, Source};

/// The connection of a [`RedisStore`]: cheap to clone (each clone shares
/// one multiplexed connection, or one cluster connection), reconnecting by
/// itself.
#[derive(Clone)]
pub(super) struct Connection {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    /// A connection the caller built ([`RedisStore::new`]).
    Manager(ConnectionManager),
    /// One node, at a fixed address or wherever Sentinel says the primary
    /// is.
    Node(Node),
    /// Every primary of a Redis Cluster, each key sent to its slot's node.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Where the shared store's Redis is, and how to log in to it: one node, a
/// primary watched by Sentinel, or (feature `cluster`) a Redis
/// Cluster; an ACL user or a password; TLS (feature `tls`).
///
/// Build a store from it with [`RedisStore::connect_with`] (or
/// [`connect_lazy_with`](RedisStore::connect_lazy_with)).
/// [`RedisStore::connect`] is the same as `connect_with` on
/// [`RedisTarget::node`].
///
/// # Secrets
///
/// Credentials, from a URL or from [`user`](RedisTarget::user) and
/// [`password`](RedisTarget::password), never appear in the `Debug` output
/// of a target or of a store, nor in their errors: `Debug` shows the
/// addresses (`host:port`), whether TLS is on, and which kind of login is
/// set.
///
/// # Example
///
/// ```
/// use tower_breaker_redis::{RedisStore, RedisOptions, RedisTarget};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_breaker::BoxError> {
/// let target = RedisTarget::sentinel(
///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
///     "breakers",
/// )?
/// .user("breaker", "s3cret");
/// assert!(!format!("{target:?}").contains("s3cret"));
///
/// // Connects at the first store call; `connect_with` would connect now.
/// let store = RedisStore::connect_lazy_with(target, RedisOptions::new())?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisTarget {
    topology: Topology,
    username: Option<String>,
    password: Option<String>,
    #[cfg(feature = "tls")]
    tls: tls::TlsFiles,
}

#[derive(Clone)]
enum Topology {
    Node(ConnectionInfo),
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        service: String,
    },
    #[cfg(feature = "cluster")]
    Cluster(Vec<ConnectionInfo>),
}

/// How to reach a data node at an address learned at run time (the
/// primary Sentinel names): its login and TLS settings.
#[derive(Clone)]
struct Dial {
    redis: RedisConnectionInfo,
    tls: bool,
    trust: Trust,
}

/// Where the store's subscriber listens for pushed decisions.
#[derive(Clone)]
enum PushSource {
    /// The first of these nodes that answers: the node, or any node of a
    /// cluster (a cluster broadcasts what is published).
    Nodes(Vec<Client>),
    /// The current primary.
    Sentinel(Arc<Sentinel>),
}

/// The certificates a target trusts (and presents), if not the system's.
#[derive(Clone, Default)]
struct Trust {
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

// === impl Connection ===

impl Connection {
    /// Checks that the server answers a `PING` within `bound` (which, for
    /// a connection not made yet, includes connecting).
    async fn ready(&mut self, bound: Duration) -> Result<(), ConnectError> {
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(self);
        match tokio::time::timeout(bound, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ConnectError::new(e)),
            Err(_) => Err(ConnectError::new(format!("no answer within {bound:?}"))),
        }
    }

    fn kind(&self) -> &'static str {
        match &self.inner {
            Inner::Manager(_) => "connection manager",
            Inner::Node(node) if node.is_sentinel() => "sentinel",
            Inner::Node(_) => "node",
            #[cfg(feature = "cluster")]
            Inner::Cluster(_) => "cluster",
        }
    }
}

impl From<ConnectionManager> for Connection {
    fn from(inner: ConnectionManager) -> Self {
        Self {
            inner: Inner::Manager(inner),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Manager(conn) => conn.req_packed_command(cmd),
            Inner::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Inner::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Manager(conn) => conn.req_packed_commands(cmd, offset, count),
            Inner::Node(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Inner::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Manager(conn) => conn.get_db(),
            Inner::Node(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Inner::Cluster(conn) => conn.get_db(),
        }
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the URL nor the connection info: they may hold a password.
        f.debug_struct("Connection")
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

// === impl RedisTarget ===

impl RedisTarget {
    /// One Redis server, or an endpoint that always leads to the current
    /// primary (a managed service's primary endpoint, such as
    /// ElastiCache's): `redis://[user:password@]host[:port][/db]`, or
    /// `rediss://` for TLS (feature `tls`).
    ///
    /// The connection reconnects by itself after errors, with backoff
    /// (50 ms doubling to 1 s, then again at the next call), so a store
    /// that was reachable once keeps working across Redis restarts.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the URL does not parse, or asks for TLS
    /// without the `tls` feature.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// let target = RedisTarget::node("redis://127.0.0.1:6379/2")?.password("s3cret");
    /// assert!(RedisTarget::node("http://127.0.0.1").is_err());
    /// # Ok::<(), tower_breaker_redis::ConnectError>(())
    /// ```
    pub fn node(url: &str) -> Result<Self, ConnectError> {
        let info = url.into_connection_info().map_err(ConnectError::new)?;
        Ok(Self::with(Topology::Node(info)))
    }

    /// The primary that the Redis Sentinels at `sentinels` (URLs, as for
    /// [`node`](RedisTarget::node)) watch under the name `service`: the
    /// store follows the primary through failovers.
    ///
    /// The store asks every sentinel at once for the primary's address and
    /// connects to the first one named, once it says it is the primary
    /// (`ROLE`). It asks again when a call fails in a way that shows the
    /// primary has gone (a dropped connection, `READONLY`, `MASTERDOWN`) or
    /// when calls go unanswered (a frozen primary), and connects to the new
    /// one. Each question is bounded by the connect timeout, and so is the
    /// connection to the primary.
    ///
    /// The credentials in the sentinels' URLs log in to the sentinels;
    /// [`user`](RedisTarget::user) and [`password`](RedisTarget::password)
    /// log in to the primary. The primary is reached over TLS when the
    /// sentinels are (`rediss://`), or when a CA is set (feature
    /// `tls`); its certificate must then name the address Sentinel
    /// gives (usually an IP address). The store uses database 0.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if there is no sentinel, a URL does not parse, or
    /// `service` is empty.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// let target = RedisTarget::sentinel(["redis://127.0.0.1:26379"], "breakers")?;
    /// assert!(RedisTarget::sentinel(Vec::<String>::new(), "breakers").is_err());
    /// # Ok::<(), tower_breaker_redis::ConnectError>(())
    /// ```
    pub fn sentinel<I>(sentinels: I, service: &str) -> Result<Self, ConnectError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let sentinels = parse_all(sentinels)?;
        if sentinels.is_empty() {
            return Err(ConnectError::new("no sentinel address given"));
        }
        if service.is_empty() {
            return Err(ConnectError::new("the sentinel service name is empty"));
        }
        Ok(Self::with(Topology::Sentinel {
            sentinels,
            service: service.to_owned(),
        }))
    }

    /// A Redis Cluster, found from one or more of its nodes (URLs, as for
    /// [`node`](RedisTarget::node); every one with the same scheme and
    /// login).
    ///
    /// Each script of the store touches one key, so every breaker lives
    /// in its key's slot and any slot layout works: `MOVED` and `ASK`
    /// replies are followed, the slot map is refreshed, and scripts are
    /// loaded on the node that runs them. A failover inside the cluster is
    /// followed the same way.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if there is no node or a URL does not parse.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// let target = RedisTarget::cluster([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])?;
    /// # let _ = target;
    /// # Ok::<(), tower_breaker_redis::ConnectError>(())
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I>(nodes: I) -> Result<Self, ConnectError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let nodes = parse_all(nodes)?;
        if nodes.is_empty() {
            return Err(ConnectError::new("no cluster node address given"));
        }
        Ok(Self::with(Topology::Cluster(nodes)))
    }

    fn with(topology: Topology) -> Self {
        Self {
            topology,
            username: None,
            password: None,
            #[cfg(feature = "tls")]
            tls: tls::TlsFiles::default(),
        }
    }

    /// Logs in as the ACL user `username` with `password` (`AUTH username
    /// password`), replacing any login in the URLs of the data nodes.
    ///
    /// Give the user only what the store needs: its key prefix (keys and
    /// channels), reads, writes, scripts and pub/sub, nothing dangerous.
    /// For example `ACL SETUSER breaker on >password ~tower-breaker:*
    /// &tower-breaker:* +@read +@write +@scripting +@pubsub +ping +time
    /// -@dangerous`; add `+cluster|slots +cluster|shards` for a cluster,
    /// `+role` through Sentinel, and `+select` for a database other than
    /// 0.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// let target = RedisTarget::node("redis://127.0.0.1:6379")?.user("breaker", "s3cret");
    /// assert!(!format!("{target:?}").contains("s3cret"));
    /// # Ok::<(), tower_breaker_redis::ConnectError>(())
    /// ```
    pub fn user(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Logs in with `password` (`AUTH password`: the `default` user, as
    /// with `requirepass`), replacing the password in the URLs of the data
    /// nodes.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// let target = RedisTarget::node("redis://127.0.0.1:6379")?.password("s3cret");
    /// # let _ = target;
    /// # Ok::<(), tower_breaker_redis::ConnectError>(())
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The login of the data nodes: the URL's, with this target's
    /// username and password in place of it.
    fn login(&self, mut redis: RedisConnectionInfo) -> RedisConnectionInfo {
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        redis
    }

    /// TLS is on for every data node whatever its URL says (a CA or a
    /// client certificate is set).
    fn tls_forced(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.tls.is_set()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    fn trust(&self) -> Trust {
        Trust {
            #[cfg(feature = "tls")]
            certs: self.tls.certificates(),
        }
    }

    /// A data node's connection info: this target's login, and TLS if it
    /// is forced.
    fn data_node(&self, info: &ConnectionInfo) -> ConnectionInfo {
        let redis = self.login(info.redis_settings().clone());
        let info = info.clone().set_redis_settings(redis);
        match info.addr() {
            ConnectionAddr::Tcp(host, port) if self.tls_forced() => {
                let addr = tls_addr(host.clone(), *port);
                info.set_addr(addr)
            }
            _ => info,
        }
    }

    /// Whether any connection of the target uses TLS.
    fn uses_tls(&self) -> bool {
        let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        self.tls_forced()
            || match &self.topology {
                Topology::Node(info) => tls(info),
                Topology::Sentinel { sentinels, .. } => sentinels.iter().any(tls),
                #[cfg(feature = "cluster")]
                Topology::Cluster(nodes) => nodes.iter().any(tls),
            }
    }

    /// The connection, not connected yet.
    fn open(&self, options: &RedisOptions) -> RedisResult<Connection> {
        let trust = self.trust();
        let inner = match &self.topology {
            Topology::Node(info) => {
                let client = trust.client(self.data_node(info))?;
                let db = client.get_connection_info().redis_settings().db();
                Inner::Node(Node::new(
                    Source::Fixed(client),
                    options.connect_timeout,
                    db,
                ))
            }
            Topology::Sentinel { .. } => {
                let source = Source::Sentinel(self.sentinel_source()?);
                Inner::Node(Node::new(source, options.connect_timeout, 0))
            }
            #[cfg(feature = "cluster")]
            Topology::Cluster(nodes) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(options.connect_timeout)
                    .set_response_timeout(options.connect_timeout);
                let client = self.cluster_client(nodes, options)?;
                Inner::Cluster(client.get_pending_async_connection_with_config(config))
            }
        };
        Ok(Connection { inner })
    }

    /// The sentinels of a Sentinel target, and how to reach the primary.
    fn sentinel_source(&self) -> RedisResult<Sentinel> {
        let Topology::Sentinel { sentinels, service } = &self.topology else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a sentinel target",
            )));
        };
        let trust = self.trust();
        let sentinels = sentinels
            .iter()
            .map(|info| trust.client(info.clone()))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Sentinel {
            sentinels,
            service: service.clone(),
            primary: Dial {
                redis: self.login(RedisConnectionInfo::default()),
                tls: self.uses_tls(),
                trust,
            },
        })
    }

    /// How the store's subscriber opens its pub/sub connection (each
    /// attempt bounded by the connect timeout; through Sentinel, asking
    /// first where the primary is).
    fn push_dial(&self, options: &RedisOptions) -> RedisResult<push::Dial> {
        let trust = self.trust();
        let source = match &self.topology {
            Topology::Node(info) => PushSource::Nodes(vec![trust.client(self.data_node(info))?]),
            Topology::Sentinel { .. } => PushSource::Sentinel(Arc::new(self.sentinel_source()?)),
            #[cfg(feature = "cluster")]
            Topology::Cluster(nodes) => PushSource::Nodes(
                nodes
                    .iter()
                    .map(|info| trust.client(self.data_node(info)))
                    .collect::<RedisResult<Vec<_>>>()?,
            ),
        };
        let bound = options.connect_timeout;
        Ok(Arc::new(move || {
            let source = source.clone();
            Box::pin(async move { source.pubsub(bound).await })
        }))
    }

    /// The connection, connected (and answering `PING`) within the connect
    /// timeout (twice it through Sentinel: asking, then connecting).
    async fn connect(&self, options: &RedisOptions) -> Result<Connection, ConnectError> {
        #[cfg(feature = "cluster")]
        if let Topology::Cluster(nodes) = &self.topology {
            let client = self
                .cluster_client(nodes, options)
                .map_err(ConnectError::new)?;
            let bound = options.connect_timeout;
            return match tokio::time::timeout(bound, client.get_async_connection()).await {
                Ok(Ok(conn)) => Ok(Connection {
                    inner: Inner::Cluster(conn),
                }),
                Ok(Err(e)) => Err(ConnectError::new(e)),
                Err(_) => Err(ConnectError::new(format!("no answer within {bound:?}"))),
            };
        }
        let mut conn = self.open(options).map_err(ConnectError::new)?;
        let bound = match &conn.inner {
            Inner::Node(node) => node.attempt_bound(),
            _ => options.connect_timeout,
        };
        conn.ready(bound).await?;
        Ok(conn)
    }

    #[cfg(feature = "cluster")]
    fn cluster_client(
        &self,
        nodes: &[ConnectionInfo],
        options: &RedisOptions,
    ) -> RedisResult<redis::cluster::ClusterClient> {
        let nodes = nodes.iter().map(|info| self.data_node(info));
        #[allow(unused_mut)]
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.connect_timeout);
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls.certificates() {
            builder = builder.certs(certs);
        }
        if self.uses_tls() {
            #[cfg(feature = "tls")]
            tls::install_provider();
        }
        builder.build()
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Addresses only (`host:port`): never a URL, a username or a password.
        let addrs = |infos: &[ConnectionInfo]| -> Vec<String> {
            infos.iter().map(|info| info.addr().to_string()).collect()
        };
        let mut d = f.debug_struct("RedisTarget");
        match &self.topology {
            Topology::Node(info) => d.field("node", &info.addr().to_string()),
            Topology::Sentinel { sentinels, service } => d
                .field("sentinels", &addrs(sentinels))
                .field("service", service),
            #[cfg(feature = "cluster")]
            Topology::Cluster(nodes) => d.field("cluster", &addrs(nodes)),
        };
        let login = match &self.topology {
            Topology::Node(info) => Some(self.login(info.redis_settings().clone())),
            #[cfg(feature = "cluster")]
            Topology::Cluster(nodes) => nodes
                .first()
                .map(|info| self.login(info.redis_settings().clone())),
            Topology::Sentinel { .. } => Some(self.login(RedisConnectionInfo::default())),
        };
        let login = match login {
            Some(redis) if redis.username().is_some() => "acl user (redacted)",
            Some(redis) if redis.password().is_some() => "password (redacted)",
            _ => "none",
        };
        d.field("login", &login)
            .field("tls", &self.uses_tls())
            .finish()
    }
}

// === impl Dial ===

impl Dial {
    fn client(&self, host: String, port: u16) -> RedisResult<Client> {
        let addr = if self.tls {
            tls_addr(host, port)
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let info = addr
            .into_connection_info()?
            .set_redis_settings(self.redis.clone());
        self.trust.client(info)
    }
}

// === impl PushSource ===

impl PushSource {
    async fn pubsub(&self, bound: Duration) -> RedisResult<PubSub> {
        let open = |client: Client| async move {
            tokio::time::timeout(bound, client.get_async_pubsub())
                .await
                .unwrap_or_else(|_| Err(node::no_answer("redis", bound)))
        };
        match self {
            Self::Nodes(clients) => {
                let mut last = None;
                for client in clients {
                    match open(client.clone()).await {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    RedisError::from((ErrorKind::InvalidClientConfig, "no node to subscribe on"))
                }))
            }
            Self::Sentinel(sentinel) => {
                let (host, port) = sentinel.primary_addr(&node::config(bound), bound).await?;
                open(sentinel.primary.client(host, port)?).await
            }
        }
    }
}

// === impl Trust ===

impl Trust {
    /// A client for `info`, trusting the target's certificates if it uses
    /// TLS (and installing the crypto provider first).
    fn client(&self, info: ConnectionInfo) -> RedisResult<Client> {
        #[cfg(feature = "tls")]
        if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            tls::install_provider();
            if let Some(certs) = &self.certs {
                return Client::build_with_tls(info, certs.clone());
            }
        }
        Client::open(info)
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`, or
    /// `rediss://` with the `tls` feature, see
    /// [`RedisTarget::node`]) and checks that it answers within the
    /// connect timeout. The same as [`connect_with`](RedisStore::connect_with)
    /// on `RedisTarget::node(url)`.
    ///
    /// The connection reconnects by itself after errors, with backoff
    /// (50 ms doubling to 1 s, then again at the next call), so a store
    /// that was reachable once keeps working across Redis restarts.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the URL or the options are refused, or the
    /// server does not answer a `PING` within the connect timeout (with
    /// the cause: refused, a wrong password, an untrusted certificate...).
    /// To start while Redis is down (failing open until it is up), use
    /// [`connect_lazy`](RedisStore::connect_lazy).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, ConnectError> {
        Self::connect_with(RedisTarget::node(url)?, options).await
    }

    /// Like [`connect`](RedisStore::connect), but does not connect before
    /// the first store call: the process starts even while Redis is down,
    /// and its breakers fail open (or closed) until it is up.
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the URL or the options are refused.
    pub fn connect_lazy(url: &str, options: RedisOptions) -> Result<Self, ConnectError> {
        Self::connect_lazy_with(RedisTarget::node(url)?, options)
    }

    /// Connects to `target` (one node, a primary watched by Sentinel, or a
    /// cluster; with its login and TLS settings) and checks that it
    /// answers: within the connect timeout, or twice it through Sentinel
    /// (asking the sentinels, then connecting to the primary).
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the options or the target's settings are
    /// refused, or Redis does not answer in time; the error says why (no
    /// answer, a refused login, an untrusted certificate...) and never
    /// holds a password.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};
    /// use tower_breaker::BreakerConfig;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), tower_breaker::BoxError> {
    /// let password = std::env::var("REDIS_PASSWORD")?;
    /// let target = RedisTarget::node("rediss://breakers.example.internal:6379")?
    ///     .user("breaker", password);
    /// let store = RedisStore::connect_with(target, RedisOptions::new()).await?;
    /// let config = BreakerConfig::new().store(Arc::new(store));
    /// # let _ = config;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_with(
        target: RedisTarget,
        options: RedisOptions,
    ) -> Result<Self, ConnectError> {
        options.check().map_err(ConnectError::new)?;
        let dial = target.push_dial(&options).map_err(ConnectError::new)?;
        let conn = target.connect(&options).await?;
        Ok(Self::with_connection(conn, options).with_push(dial))
    }

    /// Like [`connect_with`](RedisStore::connect_with), but does not
    /// connect before the first store call. Until Redis answers, each call
    /// fails with the cause of the last connection attempt (a store
    /// error: the breakers fail open, or closed, and count it).
    ///
    /// # Errors
    ///
    /// [`ConnectError`] if the options or the target's settings are
    /// refused (for example a CA file that is not PEM).
    ///
    /// # Panics
    ///
    /// With a cluster target, outside a tokio runtime (the cluster
    /// connection spawns its task at once).
    ///
    /// # Example
    ///
    /// ```
    /// use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};
    ///
    /// let target = RedisTarget::node("redis://127.0.0.1:6379")?.password("s3cret");
    /// let store = RedisStore::connect_lazy_with(target, RedisOptions::new())?;
    /// assert!(!format!("{store:?}").contains("s3cret"));
    /// # Ok::<(), tower_breaker::BoxError>(())
    /// ```
    pub fn connect_lazy_with(
        target: RedisTarget,
        options: RedisOptions,
    ) -> Result<Self, ConnectError> {
        options.check().map_err(ConnectError::new)?;
        let dial = target.push_dial(&options).map_err(ConnectError::new)?;
        let conn = target.open(&options).map_err(ConnectError::new)?;
        Ok(Self::with_connection(conn, options).with_push(dial))
    }
}

/// [`RedisStore::connect`] (or [`RedisTarget`]) could not parse the URL,
/// check the options or reach the server in time.
///
/// The message says why, and never holds a password.
///
/// # Example
///
/// ```
/// use tower_breaker_redis::{ConnectError, RedisOptions, RedisStore};
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

fn parse_all<I>(urls: I) -> Result<Vec<ConnectionInfo>, ConnectError>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    urls.into_iter()
        .map(|url| url.as_ref().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()
        .map_err(ConnectError::new)
}

fn tls_addr(host: String, port: u16) -> ConnectionAddr {
    ConnectionAddr::TcpTls {
        host,
        port,
        insecure: false,
        tls_params: None,
    }
}
