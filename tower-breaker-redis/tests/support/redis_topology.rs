//! Private Redis topologies on 127.0.0.1, started by the tests and killed
//! on drop: a 3-node Redis Cluster, and a primary with a replica watched by
//! sentinels. Also the pieces the TLS server shares: a temporary
//! directory, free ports, child processes killed on drop, and the
//! "skip loudly unless `TOWER_REQUIRE_SERVERS`" rule of
//! `support::redis_server`.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Whether every tool in `tools` runs (`<tool> --version`). When one does
/// not, says so on the real stderr and returns false so that the test
/// returns early; with `TOWER_REQUIRE_SERVERS` set, fails the test instead.
pub fn tools_or_skip(test: &str, tools: &[&str]) -> bool {
    let hint = "install redis-server to run the Redis store tests";
    tools
        .iter()
        .all(|tool| super::server_found(tool, "--version", test, hint))
}

/// A free TCP port of 127.0.0.1 (free when asked: the usual small race).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory of its own under the system's temporary directory, removed
/// on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(what: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "tower-breaker-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed (SIGKILL) on drop. Its output goes to a log
/// file, shown when it fails to start.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
}

impl Proc {
    /// Runs `redis-server` with `args` (a config file first, if any),
    /// logging to `log`, and waits until `port` accepts connections.
    pub fn redis_server(args: &[String], port: u16, log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("create a log file");
        let child = Command::new("redis-server")
            .args(args)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("redis-server runs");
        let mut proc = Self {
            child: Some(child),
            port,
            log,
        };
        proc.wait_listening();
        proc
    }

    fn wait_listening(&mut self) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "redis-server on port {} exited ({status}):\n{}",
                        self.port,
                        self.log_text()
                    );
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not start:\n{}",
                self.port,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no goodbye to the clients, no failover handshake.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) with `kill`.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("running").to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped process ignores nothing but SIGKILL; still, let it
            // go on so that it exits cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        self.kill();
    }
}

/// A plain blocking connection to 127.0.0.1:`port`, with an optional
/// password, to look behind the store's back.
pub fn raw(port: u16, password: Option<&str>) -> redis::Connection {
    let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
    redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
}

/// Polls `done` every 20 ms until it holds, for at most `limit`; returns
/// how long it took.
pub fn poll(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out ({limit:?}) waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// The common arguments of a test `redis-server`: 127.0.0.1 only, no
/// persistence, files in `dir`.
fn base_args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

// --- Redis Cluster ---

/// Three primaries (no replicas) sharing the 16384 slots.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Proc>,
    dir: TempDir,
}

impl Cluster {
    /// Starts one, or `None` (see [`tools_or_skip`]).
    pub fn start_or_skip(test: &str) -> Option<Self> {
        tools_or_skip(test, &["redis-server", "redis-cli"]).then(Self::start)
    }

    pub fn start() -> Self {
        let dir = TempDir::new("cluster");
        let nodes: Vec<Proc> = (0..3)
            .map(|_| {
                let port = free_port();
                let mut args = base_args(port, dir.path());
                args.extend(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        // The bus port of its own, free too (the default,
                        // port + 10000, may be taken or past 65535).
                        "--cluster-port",
                        &free_port().to_string(),
                        "--cluster-node-timeout",
                        "2000",
                    ]
                    .iter()
                    .map(|s| s.to_string()),
                );
                Proc::redis_server(&args, port, dir.file(&format!("node-{port}.log")))
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes, dir };
        poll(
            "cluster_state:ok on every node",
            Duration::from_secs(20),
            || {
                cluster.nodes.iter().all(|node| {
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query(&mut raw(node.port, None))
                        .unwrap_or_default();
                    info.contains("cluster_state:ok")
                }) && cluster.slot_owners_agree()
            },
        );
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    pub fn raw(&self, node: usize) -> redis::Connection {
        raw(self.nodes[node].port, None)
    }

    /// The hash slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.raw(0))
            .unwrap()
    }

    /// Which node (index) owns `slot`, as node 0 sees it.
    pub fn owner(&self, slot: u16) -> usize {
        self.owners(0)[&slot]
    }

    /// Every slot's owner (node index), as node `from` sees it.
    fn owners(&self, from: usize) -> HashMap<u16, usize> {
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.raw(from))
            .unwrap();
        let mut owners = HashMap::new();
        for range in slots {
            let (start, end, primary): (u16, u16, (String, u16)) = match range {
                redis::Value::Array(items) if items.len() >= 3 => (
                    redis::from_redis_value(items[0].clone()).unwrap(),
                    redis::from_redis_value(items[1].clone()).unwrap(),
                    {
                        let node: Vec<redis::Value> =
                            redis::from_redis_value(items[2].clone()).unwrap();
                        (
                            redis::from_redis_value(node[0].clone()).unwrap(),
                            redis::from_redis_value(node[1].clone()).unwrap(),
                        )
                    },
                ),
                other => panic!("unexpected CLUSTER SLOTS entry {other:?}"),
            };
            let index = self
                .nodes
                .iter()
                .position(|n| n.port == primary.1)
                .expect("a node of ours");
            for slot in start..=end {
                owners.insert(slot, index);
            }
        }
        owners
    }

    fn slot_owners_agree(&self) -> bool {
        let first = self.owners(0);
        first.len() == 16384 && (1..self.nodes.len()).all(|i| self.owners(i) == first)
    }

    fn node_id(&self, node: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.raw(node))
            .unwrap()
    }

    /// Moves `slot` (and its keys) to node `to`, the way resharding does:
    /// importing/migrating, `MIGRATE` of every key, then the new owner told
    /// to every node. Clients with the old slot map get `MOVED`.
    pub fn move_slot(&self, slot: u16, to: usize) {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is on node {to} already");
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let setslot = |node: usize, args: &[&str]| {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg(args);
            cmd.query::<()>(&mut self.raw(node))
                .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {args:?} on node {node}: {e}"));
        };
        setslot(to, &["IMPORTING", &from_id]);
        setslot(from, &["MIGRATING", &to_id]);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut self.raw(from))
                .unwrap();
            if keys.is_empty() {
                break;
            }
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut self.raw(from))
                .unwrap();
        }
        setslot(to, &["NODE", &to_id]);
        setslot(from, &["NODE", &to_id]);
        let other = (0..self.nodes.len()).find(|i| *i != from && *i != to);
        if let Some(other) = other {
            setslot(other, &["NODE", &to_id]);
        }
        poll(
            "every node agrees on the moved slot",
            Duration::from_secs(10),
            || (0..self.nodes.len()).all(|i| self.owners(i).get(&slot) == Some(&to)),
        );
    }

    /// The calls of `command` on node `node` so far (`INFO commandstats`).
    pub fn command_calls(&self, node: usize, command: &str) -> u64 {
        command_calls(&mut self.raw(node), command)
    }
}

/// The calls of `command` so far (`INFO commandstats`), 0 if none.
pub fn command_calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

// --- Sentinel ---

/// The name the sentinels watch the primary under.
pub const SERVICE: &str = "breakers";
/// The password of the data nodes (`requirepass`, the `default` user).
pub const DATA_PASSWORD: &str = "data-node-pw";

/// A primary, one replica and `n` sentinels (quorum 1; down after 300 ms,
/// failover timeout 1 s). The data nodes require a password.
#[derive(Debug)]
pub struct SentinelSet {
    pub primary: Proc,
    pub replica: Proc,
    pub sentinels: Vec<Proc>,
    dir: TempDir,
}

impl SentinelSet {
    /// Starts one, or `None` (see [`tools_or_skip`]).
    pub fn start_or_skip(test: &str, sentinels: usize) -> Option<Self> {
        tools_or_skip(test, &["redis-server"]).then(|| Self::start(sentinels))
    }

    pub fn start(sentinels: usize) -> Self {
        let dir = TempDir::new("sentinel");
        let data_node = |port: u16, extra: &[String]| {
            let mut args = base_args(port, dir.path());
            for a in [
                "--requirepass",
                DATA_PASSWORD,
                "--masterauth",
                DATA_PASSWORD,
            ] {
                args.push(a.to_owned());
            }
            args.extend(extra.iter().cloned());
            Proc::redis_server(&args, port, dir.file(&format!("node-{port}.log")))
        };
        let primary = data_node(free_port(), &[]);
        let replica = data_node(
            free_port(),
            &[
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                primary.port.to_string(),
            ],
        );
        poll("the replica in sync", Duration::from_secs(10), || {
            info(replica.port, "replication").contains("master_link_status:up")
        });
        let sentinels = (0..sentinels)
            .map(|i| {
                let port = free_port();
                let conf = dir.file(&format!("sentinel-{i}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {} 1\n\
                         sentinel auth-pass {SERVICE} {DATA_PASSWORD}\n\
                         sentinel down-after-milliseconds {SERVICE} 300\n\
                         sentinel failover-timeout {SERVICE} 1000\n",
                        dir.path().display(),
                        primary.port
                    ),
                )
                .unwrap();
                let args = vec![conf.display().to_string(), "--sentinel".to_owned()];
                Proc::redis_server(&args, port, dir.file(&format!("sentinel-{i}.log")))
            })
            .collect();
        let set = Self {
            primary,
            replica,
            sentinels,
            dir,
        };
        // Failover needs every sentinel to know the replica, and (with
        // more than one) the other sentinels, to elect a leader.
        let others = set.sentinels.len() - 1;
        poll(
            "the sentinels know the replica and each other",
            Duration::from_secs(20),
            || {
                set.sentinels.iter().all(|s| {
                    let mut conn = raw(s.port, None);
                    let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(SERVICE)
                        .query(&mut conn)
                        .unwrap_or_default();
                    let peers: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                        .arg("SENTINELS")
                        .arg(SERVICE)
                        .query(&mut conn)
                        .unwrap_or_default();
                    replicas.iter().any(|r| {
                        r.get("flags").is_some_and(|f| f == "slave")
                            && r.get("master-link-status").is_some_and(|s| s == "ok")
                    }) && peers.len() >= others
                })
            },
        );
        set
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The primary's port, as the first sentinel that answers says.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .find_map(|s| {
                let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}", s.port))
                    .ok()?
                    .get_connection_with_timeout(Duration::from_secs(1))
                    .ok()?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(SERVICE)
                    .query(&mut conn)
                    .ok()?;
                addr.map(|(_, port)| port)
            })
    }

    /// A connection to a data node.
    pub fn raw(&self, port: u16) -> redis::Connection {
        raw(port, Some(DATA_PASSWORD))
    }

    /// Every running sentinel names `port` as the primary, and it says so
    /// itself.
    pub fn promoted(&self, port: u16) -> bool {
        let all_say = self.sentinels.iter().filter(|s| s.is_running()).all(|s| {
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE)
                .query(&mut raw(s.port, None))
                .unwrap_or(None);
            addr.is_some_and(|(_, p)| p == port)
        });
        all_say && info_auth(port, "replication").contains("role:master")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `INFO section` of a data node of a [`SentinelSet`].
fn info(port: u16, section: &str) -> String {
    info_auth(port, section)
}

fn info_auth(port: u16, section: &str) -> String {
    redis::Client::open(format!("redis://:{DATA_PASSWORD}@127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c))
        .unwrap_or_default()
}
