//! A local DynamoDB for the DynamoDB examples (`outage --dynamodb`,
//! `lambda-dynamodb`): moto's server mode (`moto_server`, from PyPI:
//! `pip install 'moto[server]'`) started on a free port of 127.0.0.1, with
//! one thread (see [`ONE_THREAD`]), and killed when dropped, and an SDK client for it (plain HTTP, static test
//! credentials). Nothing here talks to AWS.
//!
//! Included by each binary with `#[path = "../moto.rs"] mod moto;`.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::Client;
use tokio::time::Instant;

/// The environment variable that turns a missing `moto_server` from a
/// skip into a failure (CI sets it).
const REQUIRE: &str = "TOWER_REQUIRE_SERVERS";

/// How long moto may take to listen (it imports a lot of Python: about
/// 4 s on a busy 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A `moto_server` child process on 127.0.0.1, killed on drop (its tables
/// live in its memory and go with it).
#[derive(Debug)]
pub(crate) struct MotoServer {
    child: Child,
    url: String,
}

/// What became of starting one.
#[derive(Debug)]
pub(crate) enum Started {
    /// It runs.
    Running(MotoServer),
    /// `moto_server` is not installed; the skip was announced. The
    /// example exits with this code: 0, or 1 when [`REQUIRE`] is set.
    Skipped(i32),
}

impl MotoServer {
    /// Starts moto's server on a free port of 127.0.0.1 and waits until it
    /// accepts connections. When it is not installed, says so loudly on
    /// stderr and returns [`Started::Skipped`].
    ///
    /// # Errors
    ///
    /// When it is installed but cannot be started or does not listen in
    /// time.
    pub(crate) async fn start_or_skip(example: &str) -> Result<Started, String> {
        let Some(script) = on_path("moto_server") else {
            let required = std::env::var_os(REQUIRE).is_some();
            eprintln!();
            eprintln!("========================================================================");
            eprintln!("skipped: moto_server not found (pip install 'moto[server]')");
            eprintln!("  {example} needs a local DynamoDB-compatible server to run against.");
            if required {
                eprintln!("  {REQUIRE} is set: this counts as a FAILURE.");
            }
            eprintln!("========================================================================");
            return Ok(Started::Skipped(i32::from(required)));
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
            .port();
        let mut server = Self {
            child: one_thread(&script, port)?,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "moto_server on port {port} exited at once ({status})"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "moto_server on port {port} did not listen within {START_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Started::Running(server))
    }

    /// Its address, `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto's server, serving one request at a time. Its threads do not lock
/// items, so with several two conditional writes racing on one item can
/// both pass their conditions; DynamoDB serializes the writes of an item,
/// and so does one thread. It also exits when its stdin closes, so that it
/// does not outlive an example that was interrupted. The Python is the one
/// `moto_server` names on its first line, or `python3` (pyenv's shims are
/// shell scripts).
const ONE_THREAD: &str = "
import os, sys, threading
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
import moto.server as server
run_simple = server.run_simple
server.run_simple = lambda *a, **k: run_simple(*a, **dict(k, threaded=False))
server.main(['-H', '127.0.0.1', '-p', sys.argv[1]])
";

/// Starts moto's server on `port` of 127.0.0.1 with one thread.
fn one_thread(script: &Path, port: u16) -> Result<Child, String> {
    let python = std::fs::read_to_string(script)
        .ok()
        .and_then(|text| {
            let first = text.lines().next()?.strip_prefix("#!")?.trim().to_owned();
            (first.contains("python") && !first.contains(' ')).then_some(first)
        })
        .unwrap_or_else(|| "python3".to_owned());
    Command::new(&python)
        .args(["-c", ONE_THREAD, &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start moto's server with {python}: {e}"))
}

/// The file `name` in a directory of `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// An SDK client for the local server at `url`: plain HTTP, a fixed
/// region and static test credentials (moto accepts any). Against AWS,
/// build it from `aws_config::load_from_env().await` instead.
pub(crate) fn client(url: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "examples"))
        .endpoint_url(url)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}
