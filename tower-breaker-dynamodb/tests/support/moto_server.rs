//! A private DynamoDB-compatible server per test (moto's server mode,
//! `moto_server`, from PyPI), on a free port of 127.0.0.1, killed on drop,
//! so that tests can kill and restart it (never anything but loopback).

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::Client;
use resilience_testkit::process::ChildServer;
use tower_breaker_dynamodb::{DynamoDbOptions, DynamoDbStore};

/// A `moto_server` child process.
#[derive(Debug)]
pub struct MotoServer(ChildServer);

impl MotoServer {
    /// Starts one, or, when `moto_server` is not installed, says so on the
    /// real stderr and returns `None` so that the test returns early. With
    /// `TOWER_REQUIRE_SERVERS` set (as `.ci/run` does), a missing server
    /// fails the test instead.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        let hint = "`pip install 'moto[server]'` to run the DynamoDB store tests";
        super::server_found("moto_server", "--help", test, hint).then(Self::start)
    }

    /// Starts one on a free port and waits until it accepts connections.
    ///
    /// `moto_server` serves each request in a thread of its own and does
    /// not lock items, so two conditional writes racing on one item can
    /// both pass their condition: unlike DynamoDB, which serializes the
    /// writes of an item. It runs here with one thread (moto's own `main`
    /// with werkzeug's `threaded` turned off), so its conditional writes
    /// are atomic, as DynamoDB's are.
    pub fn start() -> Self {
        let command = |port: u16| {
            let mut command = Command::new(interpreter());
            command
                .args(["-c", SINGLE_THREADED, &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            command
        };
        let accepts = |port| TcpStream::connect(("127.0.0.1", port)).is_ok();
        Self(ChildServer::start("moto_server", command, accepts))
    }

    /// The server's process id (to stop and continue it).
    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.0.port())
    }

    /// Kills it (SIGKILL). Its tables are gone with it.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts it (again) on the same port, empty.
    pub fn restart(&mut self) {
        self.0.restart();
    }

    /// An SDK client for it: plain HTTP to loopback, test credentials.
    pub fn client(&self) -> Client {
        client_for(&self.url())
    }

    /// A store on a fresh table named `table`, created here, with
    /// `options` (whose table is replaced).
    pub async fn store(&self, table: &str, options: DynamoDbOptions) -> DynamoDbStore {
        let store = DynamoDbStore::new(self.client(), options.table(table)).unwrap();
        store.create_table().await.expect("create the test table");
        store
    }
}

/// moto's server, with requests served one at a time, and a listen queue
/// long enough for the races of the tests: werkzeug asks for 128 pending
/// connections, and a thousand tasks connecting at once to a server that
/// accepts one at a time overflow it (the kernel then resets the
/// connections it drops: `Connection reset by peer`), the more so on a
/// slow or loaded machine.
const SINGLE_THREADED: &str = "
import sys
import werkzeug.serving
werkzeug.serving.BaseWSGIServer.request_queue_size = 4096
import moto.server as server
run_simple = server.run_simple
def one_thread(*args, **kwargs):
    kwargs['threaded'] = False
    return run_simple(*args, **kwargs)
server.run_simple = one_thread
server.main(['-H', '127.0.0.1', '-p', sys.argv[1]])
";

/// The Python that has moto: the one named by the `moto_server` script's
/// first line, or `python3` (when the script is a shim, as pyenv's are).
fn interpreter() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("moto_server"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| {
            let first = text.lines().next()?.strip_prefix("#!")?.trim().to_owned();
            (first.contains("python") && !first.contains(' ')).then_some(first)
        })
        .unwrap_or_else(|| "python3".to_owned())
}

/// An SDK client for the server at `url`.
pub fn client_for(url: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(url)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        // What the tests check is the store's atomicity, not latency: a
        // Python server on a busy 2-core machine may take seconds to accept
        // a thousand connections at once.
        .stalled_stream_protection(
            aws_sdk_dynamodb::config::StalledStreamProtectionConfig::disabled(),
        )
        .timeout_config(
            aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(30))
                .build(),
        )
        .build();
    Client::from_conf(config)
}

/// Options with a generous timeout (the test server is a Python process
/// on a shared 2-core machine) and a wall clock shifted by `skew_ms`.
pub fn options(skew_ms: i64) -> DynamoDbOptions {
    DynamoDbOptions::new()
        .timeout(Duration::from_secs(5))
        .clock(move || {
            let now = SystemTime::now();
            if skew_ms >= 0 {
                now + Duration::from_millis(skew_ms as u64)
            } else {
                now - Duration::from_millis(skew_ms.unsigned_abs())
            }
        })
}
